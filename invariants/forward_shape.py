"""Each forward's sequences as its page-table read shows them: their rows (slots) and context
lengths. Read from the footprint alone, so it holds for any scheduler."""

from __future__ import annotations

import numpy as np

from overlapcheck.core.trace import PAGE_TABLE, Op


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

    def rows(self, op: Op) -> np.ndarray:
        """Each sequence's row (slot)."""
        return self._get(op)[0]

    def ends(self, op: Op) -> np.ndarray:
        """Each sequence's context length."""
        return self._get(op)[1]

    def _get(self, op: Op) -> tuple[np.ndarray, np.ndarray]:
        if self._op is not op:
            self._op, self._shape = op, forward_shape(op, self.width)
        return self._shape
