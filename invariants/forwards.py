"""Forward operations, each sequence tied to the request instance it ran for.

A uid names the instance most recently received and accepted under it. Forwards are attributed in
issue order, and a check pulls them before it books a new instance (`on_receive`), so a forward
issued before a uid came back stays with the earlier request. Works for any scheduler: it reads
only the trace (uids and footprints of `forward` ops) and the messages.
"""

from __future__ import annotations

import numpy as np

from overlapcheck.core.trace import Op, TraceView
from overlapcheck.invariants.context import Request
from overlapcheck.invariants.forward_shape import forward_shape

Attributed = tuple[Op, tuple[Request | None, ...]]


class ForwardFeed:
    def __init__(self) -> None:
        self.seen = 0
        self.current: dict[int, Request] = {}  # uid -> the instance its forwards run for now

    def pull(self, trace: TraceView) -> list[Attributed]:
        """The forwards issued since the last pull, with the request of each sequence."""
        ops = trace.ops
        start, end = self.seen, len(ops)
        if start == end:
            return []
        self.seen = end
        attribute = self.current.get
        return [
            (op, tuple(map(attribute, op.uids))) for op in ops[start:end] if op.kind == "forward"
        ]

    def admit(self, req: Request | None) -> None:
        """A request booked by the harness (call after `pull`): its uid's forwards are now its."""
        if req is not None and req.rejection is None and req.aborted_step is None:
            self.current[req.uid] = req


def sequence_rows(op: Op, width: int) -> np.ndarray:
    """Each sequence's row (slot), in the forward's sequence order."""
    return forward_shape(op, width)[0]


def context_ends(op: Op, width: int) -> np.ndarray:
    """Each sequence's context length, from the forward's page-table read."""
    return forward_shape(op, width)[1]
