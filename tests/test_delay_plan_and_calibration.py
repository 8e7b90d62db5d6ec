"""CPU-side pieces of GPU replay and calibration: the delay plan from timing draws, and the profile
fit recovering the latencies that generated a synthetic measurement set."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from overlapcheck.backends.delays import DelayInjector, delay_plan
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, ReplayDelay, Timing
from overlapcheck.calibrate.fit import (
    Sample,
    as_ran,
    device_samples,
    fit_profile,
    forward_size,
    host_samples,
    lead_samples,
    tail_samples,
)
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.scenarios.named import named_scenario


def test_delay_plan_lists_exactly_the_delayed_operations() -> None:
    scenario = named_scenario("basic")
    nominal = run_scenario(scenario, SimBackend())
    assert delay_plan(nominal.trace) == []
    # Delay the 3rd and 10th timed operations.
    timing = Timing(Profile(), ReplayDelay({2: 50e-6, 9: 7e-6}))
    delayed = run_scenario(scenario, SimBackend(timing))
    plan = delay_plan(delayed.trace)
    assert [round(d.seconds * 1e6, 3) for d in plan] == [50.0, 7.0]
    assert all(d.agent in ("host", "scheduler", "engine") for d in plan)
    assert "µs" in plan[0].line()


def test_injector_applies_each_delay_to_the_same_operation_of_a_replayed_run() -> None:
    scenario = named_scenario("early-eos")
    timing = Timing(Profile(), ReplayDelay({4: 30e-6, 12: 80e-6, 20: 5e-6}))
    delayed = run_scenario(scenario, SimBackend(timing))
    plan = delay_plan(delayed.trace)
    injector = DelayInjector(plan)
    # Walk the same run's operations as a real device would issue them.
    got = [injector.take(op.step, op.agent, op.kind) for op in delayed.trace.ops]
    assert sum(1 for g in got if g) == len(plan) and not injector.missed
    assert sorted(round(g * 1e6, 3) for g in got if g) == sorted(
        round(d.seconds * 1e6, 3) for d in plan
    )


def test_fit_recovers_the_profile_that_generated_the_measurements() -> None:
    truth = Profile(
        schedule=31e-6,
        schedule_per_req=3e-6,
        launch=9e-6,
        launch_per_req=0.5e-6,
        process=22e-6,
        process_per_req=5e-6,
        h2d=4e-6,
        h2d_per_cell=0.003e-6,
        d2h=7e-6,
        forward=80e-6,
        forward_per_token=2e-6,
        forward_per_context=0.02e-6,
    )
    rng = random.Random(0)
    noise = lambda: 1 + rng.uniform(-0.01, 0.01)  # noqa: E731 -- 1 % measurement noise
    samples = []
    for _ in range(200):
        w, cells, tokens, ctx = (
            rng.randint(1, 32),
            rng.randint(1, 4000),
            rng.randint(1, 512),
            rng.randint(1, 20000),
        )
        samples += [
            Sample("schedule", (truth.schedule + truth.schedule_per_req * w) * noise(), work=w),
            Sample("launch", (truth.launch + truth.launch_per_req * w) * noise(), work=w),
            Sample("process", (truth.process + truth.process_per_req * w) * noise(), work=w),
            Sample("h2d", (truth.h2d + truth.h2d_per_cell * cells) * noise(), cells=cells),
            Sample("d2h", truth.d2h * noise()),
            Sample(
                "forward",
                (truth.forward + truth.forward_per_token * tokens + truth.forward_per_context * ctx)
                * noise(),
                tokens=tokens,
                context=ctx,
            ),
        ]
    fitted = fit_profile(samples)
    for name, want in truth.as_dict().items():
        assert getattr(fitted, name) == pytest.approx(want, rel=0.1), name


def test_fit_keeps_the_base_for_unmeasured_kinds() -> None:
    base = Profile()
    fitted = fit_profile([Sample("d2h", 1e-5), Sample("d2h", 3e-5)], base)
    assert fitted.d2h == pytest.approx(2e-5) and fitted.forward == base.forward


def test_replaying_deliveries_by_iteration_reproduces_the_run() -> None:
    """What a GPU replay does: same messages at the same iterations -> same decisions and tokens."""
    scenario = named_scenario("abort")
    original = run_scenario(scenario, SimBackend(Timing(Profile(), ReplayDelay({3: 40e-6}))))
    deliveries = original.deliveries
    again = run_scenario(scenario, SimBackend(), deliveries=deliveries)
    assert again.ok
    assert [(o.uid, o.tokens, o.finish_reason) for o in again.outcomes] == [
        (o.uid, o.tokens, o.finish_reason) for o in original.outcomes
    ]
    assert again.deliveries == deliveries

    # The same operations in the same iterations (idling until an arrival is the clock's business).
    def ops(r: RunResult) -> list[tuple[int, str, str, str]]:
        return [(op.step, op.agent, op.kind, op.label) for op in r.trace.ops if op.kind != "idle"]

    assert ops(again) == ops(original)


LAUNCH_BOUND = Profile(launch=800e-6, forward=20e-6, forward_per_token=0.0, forward_tail=30e-6)


def _launch_ends(result: RunResult) -> dict[int, float]:
    return {
        op.step: op.end
        for op in result.trace.ops
        if op.kind == "span" and op.label == "launch" and op.end is not None
    }


@pytest.mark.parametrize("tail", [30e-6, -30e-6])
def test_a_launch_bound_forward_ends_its_tail_after_the_launch_phase(tail: float) -> None:
    profile = replace(LAUNCH_BOUND, forward_tail=tail)
    result = run_scenario(named_scenario("basic"), SimBackend(Timing(profile)))
    assert result.ok
    ends = _launch_ends(result)
    forwards = [op for op in result.trace.ops if op.kind == "forward"]
    assert forwards
    for op in forwards:
        assert op.end == pytest.approx(ends[op.step] + tail)


def test_a_gpu_bound_forward_is_not_stretched_by_the_tail() -> None:
    profile = Profile(forward=2e-3, forward_tail=30e-6)
    result = run_scenario(
        named_scenario("basic").with_config(loop="normal"), SimBackend(Timing(profile))
    )
    ends = _launch_ends(result)
    for op in (op for op in result.trace.ops if op.kind == "forward"):
        assert op.end is not None and op.start is not None
        assert op.end > ends[op.step] + profile.forward_tail
        assert op.end - op.start == pytest.approx(
            profile.forward
            + profile.forward_per_token * forward_size(op)[0]
            + profile.forward_per_context * forward_size(op)[1]
        )


def test_calibrating_the_simulator_against_its_own_traces_gives_back_its_profile() -> None:
    """The trace -> samples -> fit path that calibrates from a GPU, run on simulated traces."""
    truth = Profile(forward=150e-6, forward_per_token=3e-6, forward_tail=0.0)
    traces = [
        run_scenario(named_scenario(n).with_config(loop=loop), SimBackend(Timing(truth))).trace
        for n in ("basic", "chunked-long", "memory-pressure", "shared-prefix")
        for loop in ("overlap", "normal")
    ]
    samples = [s for t in traces for s in host_samples(t) + device_samples(t)]
    fitted = fit_profile(samples, Profile(forward=1.0, d2h=1.0, launch=1.0))
    for name in ("schedule", "launch", "launch_per_req", "process", "process_per_req", "d2h"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    for name in ("forward", "forward_per_token", "h2d"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_the_tail_fit_recovers_the_tail_of_launch_bound_forwards() -> None:
    trace = run_scenario(named_scenario("chunked-long"), SimBackend(Timing(LAUNCH_BOUND))).trace
    tails = tail_samples(trace, LAUNCH_BOUND)
    assert {s.kind for s in tails} == {"forward_tail", "d2h_queued"}
    fitted = fit_profile(tails, Profile())
    assert fitted.forward_tail == pytest.approx(LAUNCH_BOUND.forward_tail, rel=1e-6)
    # Queued at the phase's end, the copy still waits for the forward to end after it.
    assert fitted.d2h_queued == pytest.approx(LAUNCH_BOUND.forward_tail, rel=1e-6)
    early = replace(LAUNCH_BOUND, forward_tail=-100e-6, d2h_queued=-40e-6)
    trace = run_scenario(named_scenario("chunked-long"), SimBackend(Timing(early))).trace
    fitted = fit_profile(tail_samples(trace, early))
    assert fitted.forward_tail == pytest.approx(-100e-6)
    assert fitted.d2h_queued == pytest.approx(-40e-6)
    # A forward that outlasts its launch is not launch-bound: it says nothing about the tail.
    gpu_bound = Profile(forward=5e-3, forward_tail=30e-6)
    trace = run_scenario(named_scenario("basic"), SimBackend(Timing(gpu_bound))).trace
    assert tail_samples(trace, gpu_bound) == []


def test_a_launch_bound_d2h_waits_until_the_host_queues_it() -> None:
    profile = replace(LAUNCH_BOUND, forward_tail=-100e-6, d2h_queued=-40e-6)
    result = run_scenario(named_scenario("basic"), SimBackend(Timing(profile)))
    assert result.ok
    ends = _launch_ends(result)
    forward_end = {op.batch: op.end for op in result.trace.ops if op.kind == "forward"}
    copies = [op for op in result.trace.ops if op.kind == "d2h"]
    assert copies
    for op in copies:
        assert op.start == pytest.approx(ends[op.step] - 40e-6)
        # The engine stream idles between the forward and its copy, as a launch-bound GPU does.
        assert op.start - forward_end[op.batch] == pytest.approx(60e-6)


def test_a_forward_starts_no_earlier_than_its_lead_into_the_launch_phase() -> None:
    profile = replace(LAUNCH_BOUND, forward_lead=200e-6)
    result = run_scenario(named_scenario("basic"), SimBackend(Timing(profile)))
    assert result.ok
    starts = {
        op.step: op.start for op in result.trace.ops if op.kind == "span" and op.label == "launch"
    }
    forwards = [op for op in result.trace.ops if op.kind == "forward"]
    for op in forwards:
        assert op.start is not None and op.start >= starts[op.step] + 200e-6 - 1e-12
    # and the calibration reads the lead back off the trace
    leads = lead_samples(result.trace)
    assert len(leads) >= len(forwards) // 2
    assert fit_profile(leads).forward_lead == pytest.approx(200e-6)
    # Without a lead, none is read off (forwards that waited for their inputs say nothing).
    plain = run_scenario(named_scenario("basic"), SimBackend(Timing(LAUNCH_BOUND))).trace
    assert fit_profile(lead_samples(plain)).forward_lead == pytest.approx(0.0, abs=1e-9)


def test_as_ran_scripts_each_request_to_the_length_the_real_run_gave_it() -> None:
    """calibrate --check times the simulator on the work the GPU actually did."""
    scripted = named_scenario("early-eos")
    real = run_scenario(scripted, SimBackend())  # stands in for a GPU run
    unscripted = replace(
        scripted, requests=tuple(replace(r, continuation=()) for r in scripted.requests)
    )
    assert [len(o.tokens) for o in run_scenario(unscripted, SimBackend()).outcomes] != [
        len(o.tokens) for o in real.outcomes
    ]
    again = run_scenario(as_ran(unscripted, real.outcomes), SimBackend())
    assert [(o.uid, len(o.tokens), o.finish_reason) for o in again.outcomes] == [
        (o.uid, len(o.tokens), o.finish_reason) for o in real.outcomes
    ]
    assert {o.finish_reason for o in real.outcomes} == {"eos"}
    # Requests that ran to their length are scripted without an EOS.
    basic = named_scenario("basic")
    full = run_scenario(basic, SimBackend())
    assert {o.finish_reason for o in full.outcomes} == {"length"}
    again = run_scenario(as_ran(basic, full.outcomes), SimBackend())
    assert [(len(o.tokens), o.finish_reason) for o in again.outcomes] == [
        (len(o.tokens), o.finish_reason) for o in full.outcomes
    ]


def test_fidelity_is_judged_against_the_gpus_own_range() -> None:
    pytest.importorskip("torch")
    from overlapcheck.calibrate.gpu import TOLERANCE, Row, misses

    # 23 % off with the host as run, but the GPU itself spread over 41 %: not the model's error.
    noisy = Row("basic", "total ms", 56.5, 55.8, 0.41, 68.6)
    # A calibrated total off by 30 % is the host's drift: reported, never judged.
    drifted = Row("basic", "iteration µs", 1.3, 1.0, 0.05, 1.05)
    assert misses([noisy, drifted]) == []
    # The host-free figure is judged with the calibrated profile too, and the range does not
    # hide an error larger than itself.
    speedup = Row("basic", "overlap speed-up", 0.5, 1.0, 0.03, 0.98)
    slow = Row("basic", "total ms", 50.0, 50.0, 0.20, 75.0)
    found = misses([speedup, slow])
    assert [(m.row.figure, m.column) for m in found] == [
        ("overlap speed-up", "sim"),
        ("total ms", "as run"),
    ]
    assert found[0].bound == TOLERANCE and found[1].bound == 0.20
    # The engine's idle share is a ratio of host phases, which drift apart: with the calibrated
    # profile it is reported; with the host as run it is judged.
    drifted_idle = Row("basic", "engine idle %", 24.0, 28.4, 0.06, 27.1)
    wrong_idle = Row("basic", "engine idle %", 1.5, 29.0, 0.04, 1.1)
    assert [(m.row.figure, m.column) for m in misses([drifted_idle, wrong_idle])] == [
        ("engine idle %", "as run")
    ]
