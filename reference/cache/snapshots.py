"""Snapshots of a page list that share its storage: what the reference's `books()` hands out.

The books are read at every iteration, and copying every list into a fresh tuple each time (a
growing request's pages, the free list's thousands) cost more than the checks that read them.
Between two snapshots a request's pages only grow at their end, and the free list only loses its
tail (until pages are freed): a snapshot is then a read-only `memoryview` of one int64 array, cut
to the list's length. An entry below a length already handed out is never written again (any
other change takes a fresh array), so no later change of the list alters a snapshot a check
holds: each is as immutable as a tuple, at the cost of a few new pages, not of the whole list.
"""

from __future__ import annotations

from array import array

_MIN_ROOM = 16  # entries a growing list's first array holds at least


class PageSnapshots:
    """One page list's snapshots: `last` (the latest, None before the first) and its storage.

    The caller says how the list changed since `last`: `after_appends` (only pages appended at
    its end) or `after_pops` (only pages taken off its end); after any other change it calls
    `reset` first. Each returns the new snapshot and what it was made from (`DerivedBooks`):
    `last` (the same object where the list is unchanged), or None (made afresh).
    """

    # `_store`: a writable view of the array (items set through it cost less than through the
    # array); `_view`: its read-only twin, which snapshots are cut from; `_n`: `last`'s length;
    # `_top`: the longest snapshot cut from this array (entries below it are never written again:
    # appends after pops below it take a fresh array).
    __slots__ = ("_n", "_store", "_top", "_view", "last")

    def __init__(self) -> None:
        self._store = memoryview(array("q"))
        self._view = self._store.toreadonly()
        self._n = self._top = 0
        self.last: memoryview | None = None

    def reset(self) -> None:
        """The list changed other than at its end: the next snapshot is made afresh."""
        self.last = None

    def after_appends(self, pages: list[int]) -> tuple[memoryview, memoryview | None]:
        """A snapshot of `pages`, which only grew at its end since `last`."""
        last, n, m = self.last, len(pages), self._n
        if n == m + 1 and m == self._top and n <= len(self._store) and last is not None:
            # A decode step's one page, with room left: the common case, tested at once.
            self._store[m] = pages[m]
            self._n = self._top = n
            snapshot = self.last = self._view[:n]
            return snapshot, last
        if last is None or n < m:
            return self._afresh(pages, max(_MIN_ROOM, 2 * n)), None
        if n == m:
            return last, last
        if m < self._top:  # an earlier, longer snapshot holds the entries past `last`
            return self._afresh(pages, max(_MIN_ROOM, 2 * n)), last
        if n > len(self._store):  # full: a larger array (the old one stays with its snapshots)
            self._move(2 * n)
        self._store[m:n] = array("q", pages[m:n])
        self._n = self._top = n
        snapshot = self.last = self._view[:n]
        return snapshot, last

    def after_pops(self, pages: list[int]) -> tuple[memoryview, memoryview | None]:
        """A snapshot of `pages`, which only lost pages at its end since `last`."""
        last, n = self.last, len(pages)
        if last is None or n > self._n:
            return self._afresh(pages, n), None
        if n == self._n:
            return last, last
        self._n = n
        snapshot = self.last = self._view[:n]  # (the last one's storage, shorter)
        return snapshot, last

    def _afresh(self, pages: list[int], room: int) -> memoryview:
        n = len(pages)
        store = array("q", pages)
        if room > n:
            store.frombytes(bytes(store.itemsize * (room - n)))
        self._store = memoryview(store)
        self._view = self._store.toreadonly()
        self._n = self._top = n
        snapshot = self.last = self._view[:n]
        return snapshot

    def _move(self, room: int) -> None:
        """A new array of `room` entries, starting with the list so far (copied as bytes)."""
        store = memoryview(array("q", bytes(8 * room)))
        store[: self._n] = self._store[: self._n]
        self._store, self._view = store, store.toreadonly()
