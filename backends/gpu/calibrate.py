"""Calibrate the simulator from a real device: measure operation durations, fit the profile, and
compare the two backends scenario by scenario."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.backends.gpu.backend import TorchBackend
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.calibrate import HOST_PHASES, Sample, fit_profile
from overlapcheck.backends.sim.timing import Profile, Timing
from overlapcheck.core.trace import HOST, KV, TOKEN_POOL, Trace
from overlapcheck.runner import RunResult, run_scenario
from overlapcheck.scenarios.named import NAMED, named_scenario
from overlapcheck.scenarios.scenario import Scenario
from overlapcheck.timeline.model import idle_gaps, idle_share, trace_end


def samples(trace: Trace) -> list[Sample]:
    """Every timed operation of a real run as a measurement; host time outside any phase (receiving,
    bookkeeping) is charged to `schedule`, which the simulator's host clock must then cover."""
    out: list[Sample] = []
    step_spans: dict[int, list[float]] = {}
    for op in trace.ops:
        if op.start is None or op.end is None:
            continue
        seconds = op.end - op.start
        if op.agent == HOST and op.kind == "span" and op.label in HOST_PHASES:
            out.append(Sample(op.label, seconds, work=op.work))
            step_spans.setdefault(op.step, []).append(seconds)
        elif op.kind == "h2d" and op.accesses:
            out.append(Sample("h2d", seconds, cells=max(len(a.cells) for a in op.accesses)))
        elif op.kind == "d2h":
            out.append(Sample("d2h", seconds))
        elif op.kind == "forward":
            tokens = next(
                (len(a.cells) for a in op.accesses if a.buffer == TOKEN_POOL and a.mode == "r"), 0
            )
            context = next(
                (len(a.cells) for a in op.accesses if a.buffer == KV and a.mode == "r"), 0
            )
            out.append(Sample("forward", seconds, tokens=tokens, context=context))
    return out + _unaccounted_host_time(trace, step_spans)


def _unaccounted_host_time(trace: Trace, spans: dict[int, list[float]]) -> list[Sample]:
    bounds: dict[int, list[float]] = {}
    for op in trace.ops:
        if op.agent == HOST and op.start is not None and op.kind not in ("idle", "host_wait"):
            lo_hi = bounds.setdefault(op.step, [op.start, op.end or op.start])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], op.start), max(lo_hi[1], op.end or op.start)
    waits: dict[int, float] = {}
    for op in trace.ops:
        if op.kind == "host_wait" and op.start is not None and op.end is not None:
            waits[op.step] = waits.get(op.step, 0.0) + (op.end - op.start)
    extra = []
    for step, (lo, hi) in bounds.items():
        other = (hi - lo) - sum(spans.get(step, []))
        if other > 0:
            extra.append(other)
    if not extra:
        return []
    mean = sum(extra) / len(extra)
    return [Sample("schedule", mean)] if mean > 0 else []


def measure(backend: TorchBackend, scenarios: list[Scenario], rounds: int = 2) -> list[Sample]:
    """Run each scenario `rounds` times (the first warms caches and compiles kernels; dropped)."""
    got: list[Sample] = []
    for scenario in scenarios:
        for r in range(rounds):
            result = run_scenario(scenario, backend, [])
            if backend.device is not None:
                backend.device.finish()
            if r > 0:
                got += samples(result.trace)
    return got


def calibrate(backend: TorchBackend, out: str | Path) -> Profile:
    scenarios = [
        named_scenario(n).with_config(loop=loop) for n in NAMED for loop in ("overlap", "normal")
    ]
    profile = fit_profile(measure(backend, scenarios))
    Path(out).write_text(json.dumps({"profile": profile.as_dict()}, indent=1) + "\n")
    return profile


@dataclass
class Figures:
    total: float
    mean_iteration: float
    engine_idle: float


def figures(result: RunResult) -> Figures:
    end = trace_end(result.trace)
    idle = idle_share(idle_gaps(result.trace, "engine", 0.0, end, end), 0.0, end)
    return Figures(end, end / max(1, result.iterations), idle)


def check(backend: TorchBackend, profile: Profile) -> list[tuple[str, str, float, float]]:
    """Per named scenario and figure: (scenario, figure, sim, real). Prints the table too."""
    rows: list[tuple[str, str, float, float]] = []
    for name in NAMED:
        got: dict[str, dict[str, Figures]] = {}
        for loop in ("overlap", "normal"):
            scenario = named_scenario(name).with_config(loop=loop)
            run_scenario(scenario, backend, [])  # warm-up
            real = run_scenario(scenario, backend, [])
            if backend.device is not None:
                backend.device.finish()
            sim = run_scenario(scenario, SimBackend(Timing(profile)), [])
            got[loop] = {"sim": figures(sim), "real": figures(real)}
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
