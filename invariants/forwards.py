"""Forward operations, each sequence tied to the request instance it ran for.

A uid names the instance most recently received and accepted under it. Forwards are attributed in
issue order, and a check pulls them before it books a new instance (`on_receive`), so a forward
issued before a uid came back stays with the earlier request. Works for any scheduler: it reads
only the trace (uids and footprints of `forward` ops) and the messages.
"""

from __future__ import annotations

import numpy as np

from overlapcheck.core.trace import PAGE_TABLE, Op, TraceView
from overlapcheck.invariants.context import Request

Attributed = tuple[Op, tuple[Request | None, ...]]


class ForwardFeed:
    def __init__(self) -> None:
        self.seen = 0
        self.current: dict[int, Request] = {}  # uid -> the instance its forwards run for now

    def pull(self, trace: TraceView) -> list[Attributed]:
        """The forwards issued since the last pull, with the request of each sequence."""
        ops = trace.ops
        out: list[Attributed] = []
        current = self.current
        for i in range(self.seen, len(ops)):
            op = ops[i]
            if op.kind == "forward":
                out.append((op, tuple(current.get(uid) for uid in op.uids)))
        self.seen = len(ops)
        return out

    def admit(self, req: Request | None) -> None:
        """A request booked by the harness (call after `pull`): its uid's forwards are now its."""
        if req is not None and req.rejection is None and req.aborted_step is None:
            self.current[req.uid] = req


def _table_read(op: Op) -> np.ndarray:
    """The forward's page-table read: `page_table[slot, 0:end]` per sequence, concatenated, so
    every sequence's part starts at column 0."""
    table = next((a for a in op.accesses if a.buffer == PAGE_TABLE and a.mode == "r"), None)
    return np.empty(0, dtype=np.int64) if table is None else table.cells


def sequence_rows(op: Op, width: int) -> np.ndarray:
    """Each sequence's row (slot), in the forward's sequence order."""
    return _shape(op, width)[0]


def context_ends(op: Op, width: int) -> np.ndarray:
    """Each sequence's context length, from the forward's page-table read."""
    return _shape(op, width)[1]


# The last forward's rows and ends: `slot-not-in-flight` and `work-bound` both ask for the same
# forward, one after the other. Keyed by the op object itself (held, so never confused with
# another); a miss only recomputes.
_last: tuple[Op, int, np.ndarray, np.ndarray] | None = None


def _shape(op: Op, width: int) -> tuple[np.ndarray, np.ndarray]:
    global _last
    if _last is not None and _last[0] is op and _last[1] == width:
        return _last[2], _last[3]
    cells = _table_read(op)
    if len(cells) == 0:
        rows = np.zeros(0, dtype=np.int64)
        ends = np.zeros(len(op.uids), dtype=np.int64)
    else:
        begins = np.flatnonzero(cells % width == 0)
        rows = cells[begins] // width
        ends = np.diff(np.append(begins, len(cells)))
    _last = (op, width, rows, ends)
    return rows, ends
