"""The reference scheduler preempts: pages on demand, recompute (vLLM's allocation-failure policy
keeping in-flight results, SGLang's retract-decode dropping them), each clean on workloads that
must preempt, each named preemption fault caught on one, and nothing changed with the switches
off."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import MessageSink, MessageSource
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference.faults import FAULTS, PREEMPTION_FAULT_CONFIG
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import NAMED, named_scenario

POLICIES = ["allocation-failure", "retract-decode"]


class Kept:
    """The reference's factory, keeping the scheduler to read its preemption count."""

    def __init__(self) -> None:
        self.built: Scheduler | None = None

    def __call__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> Scheduler:
        self.built = Scheduler(config, device, source, sink)
        return self.built

    @property
    def preemptions(self) -> int:
        assert self.built is not None
        return self.built.preemption.count


PREEMPTIBLE = list(NAMED)  # speculative decoding too (tests/test_spec_preemption.py)


def on_demand(
    scenario: Scenario, policy: str, mode: str = "recompute", **changes: object
) -> Scenario:
    return scenario.with_config(
        preemption=mode, page_alloc="on-demand", preempt_policy=policy, **changes
    )


def run(scenario: Scenario, checks: list[str] | None = None) -> tuple[RunResult, Kept]:
    kept = Kept()
    return run_scenario(scenario, SimBackend(), checks, scheduler=kept), kept


def first(result: RunResult) -> str:
    return result.violations[0].invariant if result.violations else "ok"


@pytest.mark.parametrize("loop", ["overlap", "normal"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_each_mode_and_policy_preempts_and_stays_clean(mode: str, policy: str, loop: str) -> None:
    for name in ("preemption", "memory-pressure"):
        result, kept = run(on_demand(named_scenario(name), policy, mode, loop=loop))
        assert result.ok, (name, result.violations[0].line())
        assert kept.preemptions > 0, name
        reference, _ = run(named_scenario(name).with_config(loop=loop))
        assert [o.tokens for o in result.outcomes] == [o.tokens for o in reference.outcomes]


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_on_demand_is_clean_on_every_named_scenario(mode: str, policy: str) -> None:
    for name in PREEMPTIBLE:
        result, _ = run(on_demand(named_scenario(name), policy, mode))
        assert result.ok, (name, result.violations[0].line())


def test_swap_moves_kv_on_the_transfer_stream_ordered_by_events() -> None:
    result, kept = run(on_demand(named_scenario("preemption"), "allocation-failure", "swap"))
    assert result.ok
    ops = result.trace.ops
    offloads = [op for op in ops if op.kind == "kv_offload"]
    loads = [op for op in ops if op.kind == "kv_load"]
    assert len(offloads) == len(loads) == kept.preemptions > 0
    assert {op.agent for op in offloads + loads} == {"transfer"}
    for offload in offloads:  # a swapped request decodes on: never prefilled again
        (uid,) = offload.uids
        later = ops[offload.seq :]
        assert not any(
            op.kind == "forward" and op.label[0] == "P" and uid in op.uids for op in later
        )
        load = next(op for op in later if op.kind == "kv_load" and op.uids == (uid,))
        assert any(op.kind == "wait" and op.agent == "engine" for op in ops[load.seq :][:3])


def test_reserved_pages_never_preempt_and_change_nothing() -> None:
    for name in ("basic", "chunked-long", "memory-pressure", "preemption"):
        plain, _ = run(named_scenario(name))
        armed, kept = run(named_scenario(name).with_config(preemption="recompute"))
        assert kept.preemptions == 0
        assert armed.trace_hash == plain.trace_hash, name


def test_on_demand_pages_without_preemption_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="on-demand"):
        SchedulerConfig(page_alloc="on-demand")
    with pytest.raises(ConfigError, match="preemption must be one of"):
        SchedulerConfig(preemption="evict")  # type: ignore[arg-type]


CAUGHT = {
    "retract-skips-inflight": ("oracle", "exact-length"),
    "preempt-reset-early": ("oracle", "exact-length"),
    "preempt-cascade": ("progress",),
    "swap-free-before-offload": ("no-race",),
}


def test_every_preemption_fault_has_a_scenario_here() -> None:
    # the speculative one has its scenario in tests/test_spec_preemption.py
    assert set(CAUGHT) == {f for f in PREEMPTION_FAULT_CONFIG if not FAULTS[f].speculative}
    for fault, caught in CAUGHT.items():
        assert caught[0] in FAULTS[fault].breaks


@pytest.mark.parametrize("fault", sorted(CAUGHT))
def test_each_preemption_fault_is_caught_and_the_fix_holds(fault: str) -> None:
    needs = PREEMPTION_FAULT_CONFIG[fault]
    base = on_demand(named_scenario("preemption"), needs.preempt_policy, needs.preemption)
    result, kept = run(base.with_config(faults=frozenset([fault])))
    assert first(result) in CAUGHT[fault], result.violations[0].line() if result.violations else ""
    assert kept.preemptions > 0
    fixed, _ = run(base)
    assert fixed.ok


def test_a_cascade_is_reported_at_the_progress_bound_not_the_step_bound() -> None:
    scenario = on_demand(named_scenario("preemption"), "retract-decode")
    result, _ = run(scenario.with_config(faults=frozenset(["preempt-cascade"])))
    violation = result.violations[0]
    assert violation.invariant == "progress" and "no request gained a token" in violation.message
    assert violation.step < 100  # the runner's step bound for this workload is 472


def test_the_preemption_rate_bench_counts_examples_that_preempt() -> None:
    from overlapcheck.bench import preemption_rate

    rate = preemption_rate.run(12)
    assert rate.examples == 12 and not rate.violations
    assert rate.preempted <= rate.examples and rate.preempted <= rate.preemptions
