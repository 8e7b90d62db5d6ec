"""Forward operations, each sequence tied to the request instance it ran for.

A uid names the instance most recently received and accepted under it. Forwards are attributed
once per run (`context.Attribution`), in issue order, and the harness books a new instance only
after the checks' `on_receive`, so a forward issued before a uid came back stays with the earlier
request. Works for any scheduler: it reads only the trace (uids and footprints of `forward` ops)
and the messages.
"""

from __future__ import annotations

import numpy as np

from overlapcheck.core.trace import Op
from overlapcheck.invariants.context import Attributed, RunContext
from overlapcheck.invariants.forward_shape import forward_shape

__all__ = ["Attributed", "ForwardFeed", "context_ends", "sequence_rows"]


class ForwardFeed:
    """One check's place in the run's attributed forwards (`Attribution`)."""

    def __init__(self) -> None:
        self.seen = 0  # ops pulled
        self.taken = 0  # of the attributed forwards

    def pull(self, run: RunContext) -> list[Attributed]:
        """The forwards issued since the last pull, with the request of each sequence."""
        ops = run.trace.ops
        if self.seen == len(ops):
            return []
        self.seen = len(ops)
        forwards, start = run.attribution.update(ops), self.taken
        self.taken = len(forwards)
        return forwards[start:]


def sequence_rows(op: Op, width: int) -> np.ndarray:
    """Each sequence's row (slot), in the forward's sequence order."""
    return forward_shape(op, width)[0]


def context_ends(op: Op, width: int) -> np.ndarray:
    """Each sequence's context length, from the forward's page-table read."""
    return forward_shape(op, width)[1]
