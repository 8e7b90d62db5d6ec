"""Fit the simulator's nominal profile to measured durations (least squares per operation kind).

Measurements come from traces (a real run's, recorded exactly as the simulator records its own):
host phases and the forward's lead and tail from a free-running run, stream operations' device
time from a run where each one held its stream until the host had queued all of its work (see
`calibrate/gpu.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.trace import HOST, KV, TOKEN_POOL, Op, Trace
from overlapcheck.harness.runner import RequestOutcome

HOST_PHASES = ("schedule", "launch", "process")


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured operation: its kind, duration and the sizes its cost depends on."""

    kind: str  # a host phase, a stream op kind, or forward_lead | forward_tail | d2h_queued
    seconds: float
    work: int = 0  # host phases: requests touched
    cells: int = 0  # h2d: cells copied
    tokens: int = 0  # forward: new tokens
    context: int = 0  # forward: context tokens attended over


def _fit(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Non-negative least squares (a negative cost is noise, not physics): with at most three
    terms, solving every subset of them and keeping the best non-negative fit is exact and cheap."""
    a = np.asarray(rows, dtype=float)
    b = np.asarray(y, dtype=float)
    n = a.shape[1]
    best: tuple[float, list[float]] = (float("inf"), [0.0] * n)
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (coef < 0).any():
            continue
        full = [0.0] * n
        for i, c in zip(cols, coef, strict=True):
            full[i] = float(c)
        residual = float(np.sum((a @ np.asarray(full) - b) ** 2))
        if residual < best[0]:
            best = (residual, full)
    return best[1]


def fit_profile(samples: Iterable[Sample], base: Profile | None = None) -> Profile:
    """A profile whose costs best explain `samples`; kinds without samples keep `base`'s values."""
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    changes: dict[str, float] = {}
    for phase in HOST_PHASES:
        got = by_kind.get(phase, [])
        if got:
            changes[phase], changes[f"{phase}_per_req"] = _fit(
                [[1, s.work] for s in got], [s.seconds for s in got]
            )
    if by_kind.get("h2d"):
        got = by_kind["h2d"]
        changes["h2d"], changes["h2d_per_cell"] = _fit(
            [[1, s.cells] for s in got], [s.seconds for s in got]
        )
    if by_kind.get("d2h"):
        changes["d2h"] = float(np.median([s.seconds for s in by_kind["d2h"]]))
    if by_kind.get("forward"):
        got = by_kind["forward"]
        a, b, c = _fit([[1, s.tokens, s.context] for s in got], [s.seconds for s in got])
        changes.update(forward=a, forward_per_token=b, forward_per_context=c)
    for name in ("forward_lead", "forward_tail", "d2h_queued"):
        if by_kind.get(name):
            changes[name] = float(np.median([s.seconds for s in by_kind[name]]))
    known = {f.name for f in fields(Profile)}
    assert set(changes) <= known
    return replace(base or Profile(), **changes)


def host_samples(trace: Trace) -> list[Sample]:
    """Host phase durations, less the time they spent blocked on the device (the simulator adds
    that itself). Host time outside any phase (receiving messages, the harness's bookkeeping
    between iterations) is charged to the iteration's `schedule`: the simulator's host does
    nothing else, so its schedule phase must cover that time, iteration by iteration."""
    out: list[Sample] = []
    timed = _timed(trace)
    waits = [op for op in timed if op.agent == HOST and op.kind == "host_wait"]
    outside = _host_time_outside_phases(trace)
    for op in timed:
        if op.agent == HOST and op.kind == "span" and op.label in HOST_PHASES:
            seconds = _seconds(op) - sum(_overlap(op, w) for w in waits if w.step == op.step)
            if op.label == "schedule":
                seconds += outside.pop(op.step, 0.0)  # once per iteration
            out.append(Sample(op.label, seconds, work=op.work))
    return out


def device_samples(trace: Trace) -> list[Sample]:
    """Stream operation durations (device time when the run held each op until it was queued)."""
    out: list[Sample] = []
    for op in _timed(trace):
        if op.kind == "h2d" and op.accesses:
            cells = max(len(a.cells) for a in op.accesses)
            out.append(Sample("h2d", _seconds(op), cells=cells))
        elif op.kind == "d2h":
            out.append(Sample("d2h", _seconds(op)))
        elif op.kind == "forward":
            tokens, context = forward_size(op)
            out.append(Sample("forward", _seconds(op), tokens=tokens, context=context))
    return out


def tail_samples(trace: Trace, profile: Profile) -> list[Sample]:
    """For each launch-bound forward of a free-running trace (its device time, by `profile`, would
    have ended before its launch phase did): how long after the launch phase it ended
    (`forward_tail`) and its D2H started (`d2h_queued`)."""
    launch_end = {
        op.step: op.end
        for op in _timed(trace)
        if op.agent == HOST and op.kind == "span" and op.label == "launch"
    }
    copy_start = {op.batch: _start(op) for op in _timed(trace) if op.kind == "d2h"}
    out = []
    for op in _timed(trace):
        end = launch_end.get(op.step)
        if op.kind != "forward" or end is None:
            continue
        assert op.start is not None and op.end is not None
        if op.start + profile.forward_time(*forward_size(op)) < end:
            out.append(Sample("forward_tail", op.end - end))  # < 0: the phase went on after
            copy = copy_start.get(op.batch)
            if copy is not None:
                out.append(Sample("d2h_queued", copy - end))
    return out


def lead_samples(trace: Trace) -> list[Sample]:
    """For each forward that started on its own (all stream work issued before it had ended
    `IDLE_MARGIN` earlier): how far into its launch phase it started."""
    launch_start = {
        op.step: op.start
        for op in _timed(trace)
        if op.agent == HOST and op.kind == "span" and op.label == "launch"
    }
    out = []
    busy_until = float("-inf")  # the latest end of stream work issued so far
    for op in trace.ops:
        if op.agent == HOST or op.start is None or op.end is None:
            continue
        start = launch_start.get(op.step)
        if op.kind == "forward" and start is not None and op.start > busy_until + IDLE_MARGIN:
            out.append(Sample("forward_lead", max(0.0, op.start - start)))
        busy_until = max(busy_until, op.end)
    return out


IDLE_MARGIN = 5e-6  # seconds: a forward starting this long after all earlier work did not wait


def forward_size(op: Op) -> tuple[int, int]:
    """(new tokens, context tokens) of a forward op, from its footprint."""
    tokens = next(
        (len(a.cells) for a in op.accesses if a.buffer == TOKEN_POOL and a.mode == "r"), 0
    )
    context = next((len(a.cells) for a in op.accesses if a.buffer == KV and a.mode == "r"), 0)
    return tokens, context


def _timed(trace: Trace) -> list[Op]:
    return [op for op in trace.ops if op.start is not None and op.end is not None]


def _seconds(op: Op) -> float:
    assert op.start is not None and op.end is not None
    return op.end - op.start


def _start(op: Op) -> float:
    """When `op` started (trace time)."""
    assert op.start is not None
    return op.start


def _overlap(a: Op, b: Op) -> float:
    assert a.start is not None and a.end is not None and b.start is not None and b.end is not None
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def _host_time_outside_phases(trace: Trace) -> dict[int, float]:
    """Per iteration, host time covered by no phase, wait or idle: from the end of the previous
    iteration's last host operation (the first one's start, for the first) to the end of this
    one's. The device's set-up before the first operation is no iteration's."""
    bounds: dict[int, list[float]] = {}
    covered: dict[int, list[tuple[float, float]]] = {}
    for op in _timed(trace):
        if op.agent != HOST:
            continue
        assert op.start is not None and op.end is not None
        if op.kind in ("span", "host_wait", "idle"):
            covered.setdefault(op.step, []).append((op.start, op.end))
        lo_hi = bounds.setdefault(op.step, [op.start, op.end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], op.start), max(lo_hi[1], op.end)
    extra: dict[int, float] = {}
    previous_end: float | None = None
    for step in sorted(bounds):
        lo, hi = bounds[step]
        lo = lo if previous_end is None else min(lo, previous_end)
        other = hi - lo - _union_length(covered.get(step, []), lo, hi)
        if other > UNMEASURABLE:
            extra[step] = other
        previous_end = hi
    return extra


UNMEASURABLE = 1e-7  # seconds: below the host clock's resolution


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    total, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def as_ran(scenario: Scenario, outcomes: Iterable[RequestOutcome]) -> Scenario:
    """`scenario` with each request's output scripted to the length the real run gave it: a real
    model decides where it stops (bf16 may stop a token off the script), the toy model is told,
    so that both backends time the same work."""
    done = {o.uid: o for o in outcomes if o.finish_reason in ("eos", "length")}
    cfg = scenario.config
    specs = []
    for spec in scenario.requests:
        got = done.get(spec.uid)
        if got is None:
            specs.append(spec)
            continue
        eos = got.finish_reason == "eos"
        n = len(got.tokens) - eos
        # Any ids but EOS: (eos + 1 + i) mod vocab skips exactly the EOS id.
        filler = tuple(
            (cfg.eos_token_id + 1 + i % (cfg.vocab_size - 1)) % cfg.vocab_size for i in range(n)
        )
        specs.append(replace(spec, continuation=filler + ((cfg.eos_token_id,) if eos else ())))
    return replace(scenario, requests=tuple(specs))
