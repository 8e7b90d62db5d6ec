"""Calibrate the simulator from a real device: measure operation durations, fit the profile, and
compare the two backends scenario by scenario."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.backends.gpu.backend import TorchBackend
from overlapcheck.backends.gpu.replay import sleep_cycles_per_second
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.calibrate import (
    Sample,
    as_ran,
    device_samples,
    fit_profile,
    host_samples,
    lead_samples,
    tail_samples,
)
from overlapcheck.backends.sim.timing import Profile, Timing
from overlapcheck.core.trace import HOST, Trace
from overlapcheck.runner import RunResult, run_scenario
from overlapcheck.scenarios.named import NAMED, named_scenario
from overlapcheck.scenarios.scenario import Scenario
from overlapcheck.timeline.model import idle_gaps, idle_share, trace_end
from overlapcheck.trace_io import save_trace

STREAM_KINDS = ("h2d", "d2h", "forward")


def each_run(
    backend: TorchBackend, scenarios: list[Scenario], rounds: int, take: Callable[[Trace], None]
) -> None:
    """Run each scenario `rounds` times and hand each trace to `take`, keeping none: a growing
    heap of kept traces slows the host phases being measured (measured: by a quarter)."""
    for scenario in scenarios:
        for _ in range(rounds):
            result = run_scenario(scenario, backend, [])
            if backend.device is not None:
                backend.device.finish()
            take(result.trace)
            del result


def longest_host_phase(trace: Trace) -> float:
    return max(
        (
            op.end - op.start
            for op in trace.ops
            if op.agent == HOST
            and op.kind == "span"
            and op.start is not None
            and op.end is not None
        ),
        default=0.0,
    )


@dataclass
class Calibration:
    profile: Profile
    hold: float  # seconds each stream op held its stream in the device-time runs (0: none)
    leads: list[float]  # forwards that did not wait: start minus their launch phase's start
    tails: list[float]  # launch-bound forwards: end minus their launch phase's end
    phases: dict[str, float]  # host phase: median measured seconds

    def summary(self) -> str:
        medians = ", ".join(f"{k} {v * 1e6:.0f} µs" for k, v in self.phases.items())
        return "; ".join(
            [
                f"host phases (median) {medians}",
                _spread(self.leads, "forwards that did not wait start", "into their launch phase"),
                _spread(self.tails, "launch-bound forwards end", "after their launch phase"),
            ]
        )


def _spread(values: list[float], what: str, where: str) -> str:
    if not values:
        return f"{what}: none measured"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return (
        f"{len(values)} {what} {q[4] * 1e6:+.1f} µs {where} "
        f"(median; p10 {q[0] * 1e6:+.1f}, p90 {q[8] * 1e6:+.1f})"
    )


def measure(backend: TorchBackend, scenarios: list[Scenario], base: Profile) -> Calibration:
    """Fit `base` to runs of `scenarios`. A warm-up round (kernels compile, caches fill) also
    sizes the stream hold. Then stream ops' device time, from runs where each op holds its stream
    until the host has queued it (on CUDA; the CPU runs stream work inline, so free runs give
    it). Then host phases, and the lead and tail of forwards around their launch phase, from
    free runs."""
    longest: list[float] = []
    each_run(backend, scenarios, 1, lambda t: longest.append(longest_host_phase(t)))
    # The median run's longest phase: a run that compiled kernels (seconds) must not set it.
    hold = 2 * statistics.median(longest) + 1e-3 if backend.name == "cuda" else 0.0
    device: list[Sample] = []
    if hold:
        if not backend.sleep_rate:
            backend.sleep_rate = sleep_cycles_per_second()
        backend.hold = dict.fromkeys(STREAM_KINDS, hold)
    try:
        each_run(backend, scenarios, 1, lambda t: device.extend(device_samples(t)))
    finally:
        backend.hold = {}
    streams = fit_profile(device, base)
    host: list[Sample] = []
    leads: list[Sample] = []
    tails: list[Sample] = []

    def take(trace: Trace) -> None:
        host.extend(host_samples(trace))
        leads.extend(lead_samples(trace))
        tails.extend(tail_samples(trace, streams))

    each_run(backend, scenarios, 2, take)
    phases = {
        k: statistics.median(s.seconds for s in host if s.kind == k)
        for k in sorted({s.kind for s in host})
    }
    return Calibration(
        fit_profile(host + leads + tails, streams),
        hold,
        [s.seconds for s in leads],
        [s.seconds for s in tails],
        phases,
    )


def calibrate(backend: TorchBackend, out: str | Path) -> Calibration:
    scenarios = [
        named_scenario(n).with_config(loop=loop) for n in NAMED for loop in ("overlap", "normal")
    ]
    result = measure(backend, scenarios, Profile())
    Path(out).write_text(json.dumps({"profile": result.profile.as_dict()}, indent=1) + "\n")
    return result


@dataclass
class Figures:
    total: float
    mean_iteration: float
    engine_idle: float


def figures(result: RunResult) -> Figures:
    end = trace_end(result.trace)
    idle = idle_share(idle_gaps(result.trace, "engine", 0.0, end, end), 0.0, end)
    return Figures(end, end / max(1, result.iterations), idle)


def real_figures(
    backend: TorchBackend, scenario: Scenario, repeats: int
) -> tuple[Figures, RunResult]:
    """Each figure's median over `repeats` runs after a warm-up (one run of a host-bound engine
    varies by tens of percent; the simulator, deterministic, needs one), and the last run."""
    run_scenario(scenario, backend, [])
    runs = []
    for _ in range(repeats):
        result = run_scenario(scenario, backend, [])
        if backend.device is not None:
            backend.device.finish()
        runs.append(figures(result))
    median = Figures(
        statistics.median(f.total for f in runs),
        statistics.median(f.mean_iteration for f in runs),
        statistics.median(f.engine_idle for f in runs),
    )
    return median, result


def check(
    backend: TorchBackend, profile: Profile, repeats: int = 5, traces: Path | None = None
) -> list[tuple[str, str, float, float]]:
    """Per named scenario and figure: (scenario, figure, sim, real). Prints the table too, and
    with `traces` saves each scenario's last real run and its simulated run there. The simulator
    runs each scenario as the GPU ran it: the same output lengths (`as_ran`), every message at
    the iteration the GPU received it (an arrival 10 µs either side of an iteration boundary
    otherwise changes the schedule)."""
    rows: list[tuple[str, str, float, float]] = []
    for name in NAMED:
        got: dict[str, dict[str, Figures]] = {}
        for loop in ("overlap", "normal"):
            scenario = named_scenario(name).with_config(loop=loop)
            real, last = real_figures(backend, scenario, repeats)
            sim = run_scenario(
                as_ran(scenario, last),
                SimBackend(Timing(profile)),
                [],
                deliveries=[(m.step, m.uid, m.kind) for m in last.trace.received],
            )
            got[loop] = {"sim": figures(sim), "real": real}
            if traces is not None:
                traces.mkdir(parents=True, exist_ok=True)
                save_trace(last, traces / f"{name}-{loop}-{backend.name}.json")
                save_trace(sim, traces / f"{name}-{loop}-sim.json")
        o, n = got["overlap"], got["normal"]
        rows += [
            (name, "total ms", o["sim"].total * 1e3, o["real"].total * 1e3),
            (name, "iteration µs", o["sim"].mean_iteration * 1e6, o["real"].mean_iteration * 1e6),
            (name, "engine idle %", o["sim"].engine_idle * 100, o["real"].engine_idle * 100),
            (
                name,
                "overlap speed-up",
                n["sim"].total / o["sim"].total,
                n["real"].total / o["real"].total,
            ),
        ]
    print(f"{'scenario':<16}{'figure':<18}{'sim':>10}{'gpu':>10}{'error':>8}")
    for name, fig, sim_value, real_value in rows:
        err = abs(sim_value - real_value) / real_value * 100 if real_value else 0.0
        print(f"{name:<16}{fig:<18}{sim_value:>10.3f}{real_value:>10.3f}{err:>7.1f}%")
    return rows
