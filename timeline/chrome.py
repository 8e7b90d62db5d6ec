"""Chrome Trace Event JSON: opens in ui.perfetto.dev and chrome://tracing.

One process per run (one for a plain trace, two for a comparison), one named thread per lane, a
complete event (`X`) per operation that ran, a flow (`s` -> `f`) per synchronisation edge, and for a
violation a global instant plus a flow between the two conflicting operations.

Times are written in microseconds from whole nanoseconds, so that back-to-back operations on a
stream meet exactly and Perfetto does not see them overlap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlapcheck.core.errors import UserError
from overlapcheck.core.trace import HOST, Op
from overlapcheck.timeline.model import (
    Panel,
    batch_labels,
    interval,
    lanes,
    span_batches,
    sync_edges,
    tokens_by_batch,
    violation_ops,
)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _us(seconds: float) -> float:
    return _ns(seconds) / 1000


def chrome_trace(panels: Sequence[Panel]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    flow_id = 0
    for index, panel in enumerate(panels):
        pid = index + 1
        trace = panel.trace
        tids = {lane.agent: i + 1 for i, lane in enumerate(lanes(trace))}
        events.append(_meta(pid, 0, "process_name", panel.title))
        events.append(_meta(pid, 0, "process_sort_index", pid, key="sort_index"))
        for order, lane in enumerate(lanes(trace)):
            tid = tids[lane.agent]
            events.append(_meta(pid, tid, "thread_name", lane.name))
            events.append(_meta(pid, tid, "thread_sort_index", order, key="sort_index"))
        # Each flow event goes right after the slice it binds to: Perfetto binds a flow event to
        # the slice on top of its thread's stack, and events at equal times keep their file order.
        after: dict[int, list[dict[str, Any]]] = {}
        for record, wait in sync_edges(trace):
            flow_id += 1
            _flow(after, flow_id, "sync", f"e{record.records}", pid, tids, record, wait)
        v = panel.violation
        if v is not None:
            first, second = violation_ops(trace, v)
            if first is not None and second is not None:
                flow_id += 1
                _flow(after, flow_id, "violation", v.invariant, pid, tids, first, second)
        labels, tokens, spans = batch_labels(trace), tokens_by_batch(trace), span_batches(trace)
        for op in trace.ops:
            events.append(_op_event(op, pid, tids[op.agent], panel.total, labels, tokens, spans))
            events += after.get(op.seq, [])
        if v is not None:
            events.append(
                {
                    "name": f"VIOLATION {v.invariant}",
                    "cat": "violation",
                    "ph": "i",
                    "s": "g",
                    "ts": _us(v.time),
                    "pid": pid,
                    "tid": tids[HOST],
                    "args": {
                        "message": v.message,
                        "step": v.step,
                        "uids": list(v.uids),
                        **_jsonable(v.details),
                    },
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": "overlapcheck",
            "runs": [{"title": p.title, "total_seconds": p.total} for p in panels],
        },
    }


def write_chrome(panels: Sequence[Panel], out: Path) -> None:
    try:
        out.write_text(json.dumps(chrome_trace(panels), separators=(",", ":")) + "\n")
    except OSError as err:
        raise UserError(f"{out}: cannot write the timeline: {err.strerror or err}") from None


def _meta(pid: int, tid: int, name: str, value: object, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _op_event(
    op: Op,
    pid: int,
    tid: int,
    end: float,
    labels: dict[int, str],
    tokens: dict[int, dict[int, int]],
    spans: dict[int, int],
) -> dict[str, Any]:
    batch = op.batch if op.batch is not None else spans.get(op.seq)
    args: dict[str, Any] = {"seq": op.seq, "kind": op.kind, "step": op.step, "phase": op.phase}
    if batch is not None:
        args["batch"] = labels.get(batch, f"#{batch}")
    if op.uids:
        args["uids"] = list(op.uids)
    learned = op.kind in ("forward", "d2h", "read_output") or op.label == "process"
    if batch is not None and learned and batch in tokens:
        args["tokens"] = {str(uid): tok for uid, tok in tokens[batch].items()}
    if op.records is not None:
        args["records"] = f"e{op.records}"
    if op.waits is not None:
        args["waits"] = f"e{op.waits}"
    if op.delay:
        args["injected_delay_us"] = op.delay * 1e6
    if op.accesses:
        args["accesses"] = [a.describe() for a in op.accesses]
    name = op.label or op.kind
    if op.kind == "span" and batch is not None:
        name = f"{op.label} {labels.get(batch, '')}".strip()
    when = interval(op, end)
    if when is None:  # queued, never ran before the run stopped: mark where it was issued
        args["never_ran"] = True
        return {
            "name": f"queued {name}",
            "cat": op.kind,
            "ph": "i",
            "s": "t",
            "ts": _us(op.issue),
            "pid": pid,
            "tid": tid,
            "args": args,
        }
    if op.end is None:
        args["unfinished"] = True
    start_ns = _ns(when[0])
    return {
        "name": name,
        "cat": op.kind,
        "ph": "X",
        "ts": start_ns / 1000,
        "dur": (_ns(when[1]) - start_ns) / 1000,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _anchor(op: Op) -> float:
    return _us(op.start if op.start is not None else op.issue)


def _flow(
    after: dict[int, list[dict[str, Any]]],
    flow_id: int,
    cat: str,
    name: str,
    pid: int,
    tids: dict[str, int],
    src: Op,
    dst: Op,
) -> None:
    # A flow is matched by (id, cat, name); "bp": "e" binds its end to the enclosing slice.
    after.setdefault(src.seq, []).append(
        {
            "name": name,
            "cat": cat,
            "ph": "s",
            "id": flow_id,
            "ts": _anchor(src),
            "pid": pid,
            "tid": tids[src.agent],
            "args": {"from_seq": src.seq},
        }
    )
    after.setdefault(dst.seq, []).append(
        {
            "name": name,
            "cat": cat,
            "ph": "f",
            "bp": "e",
            "id": flow_id,
            "ts": _anchor(dst),
            "pid": pid,
            "tid": tids[dst.agent],
            "args": {"to_seq": dst.seq},
        }
    )


def _jsonable(details: dict[str, Any]) -> dict[str, Any]:
    # Details come from the checkers and may hold values JSON cannot; show those as text.
    plain: dict[str, Any] = json.loads(json.dumps(details, default=str))
    return plain
