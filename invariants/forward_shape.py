"""Each forward's sequences as its page-table read shows them: their rows (slots) and context
lengths. Read from the footprint alone, so it holds for any scheduler. And the run's forwards
(and KV offloads), found once for every check that reads them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from overlapcheck.core.trace import KV_OFFLOAD, PAGE_TABLE, Op, op_kind


def forward_shape(op: Op, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, context lengths) of the forward's sequences, in its sequence order. The page-table
    read is `page_table[slot, 0:end]` per sequence, concatenated, so every sequence's part starts
    at column 0 of a row `width` cells wide. A forward the recorder made carries them
    (`Op.shape`), and a trace read from a file has them derived here."""
    if op.shape is not None:
        return op.shape
    table = next((a for a in op.accesses if a.buffer == PAGE_TABLE and a.mode == "r"), None)
    cells = np.empty(0, dtype=np.int64) if table is None else table.cells
    if len(cells) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(len(op.uids), dtype=np.int64)
    begins = np.flatnonzero(cells % width == 0)
    return cells[begins] // width, np.diff(np.append(begins, len(cells)))


class ShapeCache:
    """The latest forward's shape, for one run: several checks ask for the same forward one after
    another. Keyed by the op object itself (held, so never confused with another)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._op: Op | None = None
        self._shape = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._lists_op: Op | None = None
        self._lists: tuple[list[int], list[int]] = ([], [])

    def rows(self, op: Op) -> np.ndarray:
        """Each sequence's row (slot)."""
        return self._get(op)[0]

    def ends(self, op: Op) -> np.ndarray:
        """Each sequence's context length."""
        return self._get(op)[1]

    def lists(self, op: Op) -> tuple[list[int], list[int]]:
        """`rows` and `ends` as lists (the checks loop over them in Python)."""
        if self._lists_op is not op:
            rows, ends = self._get(op)
            self._lists_op, self._lists = op, (rows.tolist(), ends.tolist())
        return self._lists

    def _get(self, op: Op) -> tuple[np.ndarray, np.ndarray]:
        if self._op is not op:
            self._op, self._shape = op, forward_shape(op, self.width)
        return self._shape


class ForwardIndex:
    """The forwards of one run's trace in issue order, with their places in it, and its KV
    offloads to the host that name a request: found once, as ops are issued, for every check
    that reads them (`progress`, `work-bound`, `slot-not-in-flight`). Each of them scanning
    every new op for its forwards cost more than its own work on them."""

    def __init__(self) -> None:
        self.scanned = 0  # ops looked at
        self.forwards: list[Op] = []
        self.places: list[int] = []  # each forward's index in the trace
        self.offloads: list[Op] = []

    def update(self, ops: Sequence[Op]) -> int:
        """Take in the ops issued since the last call; how many there are."""
        start, end = self.scanned, len(ops)
        if start == end:
            return end
        new = ops[start:end]
        kinds = list(map(op_kind, new))  # then searched in C: most ops are not forwards
        at = 0
        for _ in range(kinds.count("forward")):
            at = kinds.index("forward", at) + 1
            self.forwards.append(new[at - 1])
            self.places.append(start + at - 1)
        if KV_OFFLOAD in kinds:
            self.offloads += [op for op in new if op.kind == KV_OFFLOAD and op.uids]
        self.scanned = end
        return end
