"""What the books' page lists gained and lost since the last snapshot, list by list.

A decode iteration moves a few pages between lists of a few thousand: judging the change costs
that much instead of a pass over every page. Each list is matched to its last snapshot under
the same key (compared in C: tuples mostly by identity of their ints, the reference's
`memoryview`s by value) and recognised as
unchanged, grown at its end, or cut at its head or tail; its lost and gained pages are then
exactly the difference. A list the scheduler says it made from the last one (`DerivedBooks`: grown
or cut at its tail) is recognised by identity of that one, without comparing them. Any other
change counts as the whole old list lost and the whole new one gained, which is as exact, only
slower.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class PageChanges:
    """Per list (any hashable key): its last snapshot; per snapshot: the pages lost and gained."""

    def __init__(self) -> None:
        self._last: dict[Hashable, Sequence[int]] = {}
        self._next: dict[Hashable, Sequence[int]] = {}
        self.lost: list[int] = []
        self.gained: list[int] = []

    def start_over(self, lists: dict[Hashable, Sequence[int]]) -> None:
        """The next snapshot is compared with `lists` (by key), and with nothing else."""
        self._last, self._next = lists, {}
        self.lost, self.gained = [], []

    def add(
        self, key: Hashable, pages: Sequence[int], made_from: Sequence[int] | None = None
    ) -> bool:
        """One list of the snapshot: what it lost and gained since the last one under `key`.
        False when it is the same list. `made_from`: the list the scheduler made this one from
        (`DerivedBooks`): if that is the last one, the two agree on their common length."""
        self._next[key] = pages
        before = self._last.get(key, ())
        if before is pages:
            return False
        n, m = len(pages), len(before)
        if made_from is before:
            if n > m:
                self.gained += pages[m:]
            elif n < m:
                self.lost += before[n:]
            return n != m
        # (each slice is a copy of the list: an end that differs rules its case out first)
        if n == m:
            if pages == before:
                return False
        elif n > m:
            if (not m or pages[m - 1] == before[-1]) and pages[:m] == before:
                self.gained += pages[m:]
                return True
        elif (not n or pages[n - 1] == before[n - 1]) and pages == before[:n]:
            self.lost += before[n:]
            return True
        elif n and pages[0] == before[m - n] and pages == before[m - n :]:
            self.lost += before[: m - n]
            return True
        self.lost += before
        self.gained += pages
        return True

    def add_many(
        self,
        keys: list[Hashable],
        lists: list[Sequence[int]],
        made_from: Sequence[Sequence[int] | None],
    ) -> None:
        """`add` for each key, list and what it was made from, in order, with the common case
        (made from its last one, or it is the last one) in one loop, not a call each: a decode
        iteration grows every request's list."""
        last, nxt, gained, lost = self._last.get, self._next, self.gained, self.lost
        for key, pages, base in zip(keys, lists, made_from, strict=True):
            before = last(key, ())
            if pages is before:
                nxt[key] = pages
            elif base is before:
                nxt[key] = pages
                n, m = len(pages), len(before)
                if n == m + 1:  # (a decode step's one page: no slice to make)
                    gained.append(pages[m])
                elif n > m:
                    gained += pages[m:]
                elif n < m:
                    lost += before[n:]
            else:
                self.add(key, pages, base)

    def done(self) -> None:
        """The snapshot is over: a list of the last one that is not in it lost all its pages."""
        last, nxt = self._last, self._next
        if not last.keys() <= nxt.keys():
            for key, pages in last.items():
                if key not in nxt:
                    self.lost += pages
        self._last, self._next = nxt, {}

    def moved_only(self) -> bool:
        """Every page lost by one list was gained by another, and nothing else changed (the
        multisets of lost and gained pages are equal); then clears them for the next snapshot."""
        lost, gained = self.lost, self.gained
        self.lost, self.gained = [], []
        if len(lost) != len(gained):
            return False
        if not lost:
            return True
        try:
            lost.sort()
            gained.sort()
        except TypeError:  # not all numbers: the full check says what they are
            return False
        return lost == gained
