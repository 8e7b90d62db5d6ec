"""What both renderers read off a trace: lanes, op intervals, sync edges, batch labels, idle gaps.

Lanes are the host and one per stream. Copies stay on the stream that issued them instead of a
separate copy-engine lane: stream order is what the race checker and the sync edges reason about,
and in our traces each copy direction belongs to one stream (H2D on the scheduler stream, D2H on
the engine stream), so a copy-engine lane would repeat those boxes without adding an ordering.
Copies get their own colour instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.core.trace import HOST, Op, Trace
from overlapcheck.invariants.base import Violation

SCHEDULER = "scheduler"
ENGINE = "engine"
STREAM_ORDER = (SCHEDULER, ENGINE)
# Stream work that keeps the device busy; waits and records are the stream standing still.
BUSY_KINDS = frozenset({"forward", "h2d", "d2h"})

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Lane:
    agent: str
    name: str


@dataclass(frozen=True, slots=True)
class Panel:
    """One run to draw: its trace, a title, when the run ended, and the violation to mark."""

    trace: Trace
    title: str
    total: float
    violation: Violation | None = None


def lanes(trace: Trace) -> list[Lane]:
    """Host, then the scheduler and engine streams, then any other stream in order of appearance."""
    agents = [HOST, *STREAM_ORDER]
    for op in trace.ops:
        if op.agent not in agents:
            agents.append(op.agent)
    return [Lane(a, a if a == HOST else f"{a} stream") for a in agents]


def trace_start(trace: Trace) -> float:
    """When the run's first operation was issued (0 on the simulator; a real device's clock
    starts earlier, when the device is made)."""
    return trace.ops[0].issue if trace.ops else 0.0


def trace_end(trace: Trace) -> float:
    """The last moment anything in the trace happened (the run's simulated time)."""
    times = [0.0]
    for op in trace.ops:
        times.append(op.issue)
        times.extend(t for t in (op.start, op.end) if t is not None)
    times.extend(m.time for m in trace.messages + trace.received)
    return max(times)


def interval(op: Op, end: float) -> Interval | None:
    """When the op ran; an op cut off by the end of the run runs to `end`; None if never started."""
    if op.start is None:
        return None
    return op.start, op.end if op.end is not None else max(op.start, end)


def sync_edges(trace: Trace) -> list[tuple[Op, Op]]:
    """(record, wait) pairs: stream waits, host waits, and the record+wait of `wait_stream`."""
    recorded: dict[int, Op] = {}
    edges = []
    for op in trace.ops:
        if op.waits is not None and op.waits in recorded:
            edges.append((recorded[op.waits], op))
        if op.records is not None:
            recorded[op.records] = op
    return edges


def batch_labels(trace: Trace) -> dict[int, str]:
    """Batch id -> its label (`P1`, `D2`), from the forwards."""
    return {op.batch: op.label for op in trace.ops if op.kind == "forward" and op.batch is not None}


def span_batches(trace: Trace) -> dict[int, int]:
    """Host span seq -> the batch it worked on: the first batch among the ops issued inside it.

    A `schedule` span stages batch N+1, a `launch` span issues its forward, a `process` span reads
    batch N's output, so this names each host box after the batch the host was busy with.
    """
    out: dict[int, int] = {}
    current: Op | None = None
    for op in trace.ops:
        if op.agent == HOST and op.kind in ("span", "idle"):
            current = op if op.kind == "span" else None
        elif current is not None and op.batch is not None and current.seq not in out:
            out[current.seq] = op.batch
    return out


def tokens_by_batch(trace: Trace) -> dict[int, dict[int, int]]:
    """Batch id -> {uid: token} the host learned from it (only tokens it reported)."""
    read_at: dict[int, Op] = {op.step: op for op in trace.ops if op.kind == "read_output"}
    out: dict[int, dict[int, int]] = {}
    for m in trace.messages:
        read = read_at.get(m.step)
        # A step processes at most one batch; its token messages follow the read of its output.
        if m.kind != "token" or read is None or read.batch is None or m.time < read.issue:
            continue
        out.setdefault(read.batch, {})[m.uid] = m.token
    return out


def busy_intervals(trace: Trace, agent: str, end: float) -> list[Interval]:
    spans = (interval(op, end) for op in trace.ops if op.agent == agent and op.kind in BUSY_KINDS)
    return _merge(s for s in spans if s is not None)


def idle_gaps(trace: Trace, agent: str, lo: float, hi: float, end: float) -> list[Interval]:
    """Stretches of [lo, hi] in which `agent` ran no kernel or copy."""
    gaps = []
    cursor = lo
    for a, b in busy_intervals(trace, agent, end):
        if b <= cursor:
            continue
        if a >= hi:
            break
        if a > cursor:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < hi:
        gaps.append((cursor, hi))
    return gaps


def idle_share(gaps: list[Interval], lo: float, hi: float) -> float:
    return sum(b - a for a, b in gaps) / (hi - lo) if hi > lo else 0.0


def _merge(spans: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def violation_ops(trace: Trace, violation: Violation) -> tuple[Op | None, Op | None]:
    """The two operations a violation links, earlier first: a race's two accesses; a slot handed
    out under an in-flight batch: that batch's forward and the forward that took the slot; for a
    violation about one batch, that batch's forward and no second op."""
    details = violation.details
    ops = trace.ops

    def op_at(key: str) -> Op | None:
        entry = details.get(key)
        seq = entry.get("seq") if isinstance(entry, dict) else None
        return ops[seq] if isinstance(seq, int) and 0 <= seq < len(ops) else None

    first, second = op_at("first"), op_at("second")
    if first is None and second is None and violation.invariant == SLOT_NOT_IN_FLIGHT:
        first, second = _slot_forwards(trace, violation)
    if first is None and second is None and isinstance(details.get("batch"), int):
        batch = details["batch"]
        first = next((op for op in ops if op.kind == "forward" and op.batch == batch), None)
    return first, second


SLOT_NOT_IN_FLIGHT = "slot-not-in-flight"


def _slot_forwards(trace: Trace, violation: Violation) -> tuple[Op | None, Op | None]:
    """The two forwards of a slot-not-in-flight report, found from its uids (the newcomer, then
    the request still in flight on the slot): the report names them only in its message.

    The check runs at the end of every iteration, so the forward that took the slot is the
    newcomer's last one issued by the violation's step; the in-flight one is the last forward of
    the other request before it (a request keeps its slot, so that is the one that held it).
    """
    if len(violation.uids) != 2:
        return None, None
    newcomer, holder = violation.uids
    forwards = [op for op in trace.ops if op.kind == "forward" and op.step <= violation.step]
    second = next((op for op in reversed(forwards) if newcomer in op.uids), None)
    if second is None:
        return None, None
    first = next(
        (op for op in reversed(forwards) if op.seq < second.seq and holder in op.uids), None
    )
    return first, second


def drawn_as(trace: Trace, op: Op) -> Op:
    """The op whose box shows `op` on a picture: a host call that takes no time (staging, reading
    an output, a wait that did not block) is drawn as the host span it was issued in."""
    if op.agent != HOST or op.kind in ("span", "idle") or _lasts(op):
        return op
    for earlier in reversed(trace.ops[: op.seq]):
        if earlier.agent == HOST and earlier.kind in ("span", "idle"):
            inside = earlier.start is not None and earlier.start <= op.issue
            ends_after = earlier.end is None or op.issue <= earlier.end
            return earlier if inside and ends_after else op
    return op


def _lasts(op: Op) -> bool:
    return op.start is not None and op.end is not None and op.end > op.start


def highlighted_ops(trace: Trace, violation: Violation) -> tuple[Op, ...]:
    """The boxes a picture outlines for a violation: the box of each operation it links."""
    out: dict[int, Op] = {}
    for op in violation_ops(trace, violation):
        if op is not None:
            box = drawn_as(trace, op)
            out.setdefault(box.seq, box)
    return tuple(out.values())


# -- what a rendered panel shows ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PanelSummary:
    """What one panel shows, for callers, tests and `timeline --json`: its headline, total, engine
    idle share, and what was drawn."""

    title: str
    total: float
    engine_idle: float
    boxes: int = 0
    operations: int = 0  # in the trace, drawn or not
    violation: str | None = None  # the invariant of the violation marked, if any
    outlined: tuple[int, ...] = ()  # pictures: seqs of the boxes outlined for the violation


@dataclass(frozen=True, slots=True)
class Rendered:
    """A written timeline. `size_in` is None for Chrome JSON."""

    path: Path
    panels: tuple[PanelSummary, ...]
    size_in: tuple[float, float] | None = None
    dpi: int = 0

    @property
    def size_px(self) -> tuple[int, int]:
        assert self.size_in is not None, "a JSON timeline has no picture size"
        return round(self.size_in[0] * self.dpi), round(self.size_in[1] * self.dpi)


def measured(panel: Panel, window: Interval | None) -> Interval:
    """The stretch a panel's numbers cover: the window (if any) within the run."""
    lo, hi = window if window is not None else (0.0, panel.total)
    return max(lo, 0.0), max(min(hi, panel.total), max(lo, 0.0))


def engine_idle(panel: Panel, window: Interval | None) -> list[Interval]:
    """Idle stretches of the engine stream inside the window, up to the end of the run."""
    lo, hi = measured(panel, window)
    return idle_gaps(panel.trace, ENGINE, lo, hi, panel.total)


def summarise(panel: Panel, window: Interval | None) -> PanelSummary:
    share = idle_share(engine_idle(panel, window), *measured(panel, window))
    title = f"{panel.title}: {fmt_time(panel.total)} total, engine stream idle {share:.0%}"
    if window is not None:
        title += f" in the window {window[0] * 1e6:g}-{window[1] * 1e6:g} µs"
    violation = panel.violation.invariant if panel.violation is not None else None
    return PanelSummary(
        title, panel.total, share, operations=len(panel.trace.ops), violation=violation
    )


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"
