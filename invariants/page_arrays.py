"""The books' page lists as int64 arrays, converted from Python ints only where they changed.

A scheduler's books are a fresh snapshot every iteration, and converting a few thousand Python
ints costs more than the check that reads them. Between two snapshots a list mostly stays the
same, grows at its end (a request's pages), or loses its head or tail (a free list the allocator
takes from): each of those is recognised by comparing the list (in C: a tuple mostly by identity,
a `memoryview` by value) with the previous snapshot of the same list, and only new pages are
converted. The array is always exactly the list: anything else is converted whole.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def _convert(pages: Sequence[int]) -> np.ndarray:
    if type(pages) is memoryview and pages.format == "q":  # (the reference's: one buffer copy)
        return np.array(pages, np.int64)
    return np.fromiter(pages, np.int64, len(pages))


class PageArrays:
    """Per list (any hashable key): its last snapshot and that snapshot as an array."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[Sequence[int], np.ndarray]] = {}
        self._next: dict[Hashable, tuple[Sequence[int], np.ndarray]] = {}

    def array(self, key: Hashable, pages: Sequence[int]) -> np.ndarray:
        """`pages` as an int64 array, kept for the next snapshot under `key`."""
        out = self._derive(self._last.get(key), pages)
        self._next[key] = (pages, out)
        return out

    def done(self) -> None:
        """The snapshot is over: lists not asked for in it are forgotten."""
        self._last, self._next = self._next, {}

    @staticmethod
    def _derive(last: tuple[Sequence[int], np.ndarray] | None, pages: Sequence[int]) -> np.ndarray:
        if last is None:
            return _convert(pages)
        before, array = last
        n, m = len(pages), len(before)
        if n == m:
            return array if pages == before else _convert(pages)
        if n > m:
            if pages[:m] == before:
                return np.concatenate((array, _convert(pages[m:])))
            return _convert(pages)
        if pages == before[:n]:
            return array[:n]
        if n and pages == before[m - n :]:
            return array[m - n :]
        return _convert(pages)
