"""Forward operations, each sequence tied to the request instance it ran for.

A uid names the instance most recently received and accepted under it. Forwards are attributed in
issue order, and a check pulls them before it books a new instance (`on_receive`), so a forward
issued before a uid came back stays with the earlier request. Works for any scheduler: it reads
only the trace (uids and footprints of `forward` ops) and the messages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from overlapcheck.core.trace import Op, TraceView
from overlapcheck.invariants.context import Request
from overlapcheck.invariants.forward_shape import ForwardIndex, forward_shape

Attributed = tuple[Op, tuple[Request | None, ...]]


class ForwardFeed:
    """A check's forwards with their requests. One feed is pulled either from the trace
    (`pull`) or from the run's index of forwards (`pull_indexed`), never both."""

    def __init__(self) -> None:
        self.seen = 0  # ops pulled
        self.taken = 0  # of the index's forwards (`pull_indexed`)
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

    def pull_indexed(self, index: ForwardIndex, ops: Sequence[Op]) -> list[Attributed]:
        """`pull`, from the index of the run whose trace's ops are `ops`."""
        end = index.update(ops)
        if self.seen == end:
            return []
        self.seen = end
        forwards, start = index.forwards, self.taken
        self.taken = len(forwards)
        attribute = self.current.get
        return [(op, tuple(map(attribute, op.uids))) for op in forwards[start:]]

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
