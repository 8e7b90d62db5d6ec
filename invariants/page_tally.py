"""How often each page is listed free, cached and held, kept up to date from the books' changes.

`pages-conserved` holds when every page of 0..n-1 is listed in exactly one of these ways: free
once (and nowhere else), cached once (held by any number of requests besides: the prefix cache
shares it), or held once (and not cached). A snapshot that passed the full check is tallied once;
each later one only moves the counts of the pages its lists lost and gained (`PageChanges`, per
kind of list), and re-judges those pages, so an iteration costs what changed, not a pass over
every page (which grows with the pool). The tally passes a snapshot exactly when the full check
would; anything it cannot count (a page outside 0..n-1, not an integer) sends the snapshot to
the full check, which also says what is wrong.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain

from overlapcheck.invariants.page_changes import PageChanges

FREE, CACHED, HELD = 0, 1, 2


def page_ok(free: int, cached: int, held: int) -> bool:
    """One page's counts are right: free once alone, cached once (held any number of times
    besides), or held once alone."""
    if free:
        return free == 1 and not cached and not held
    return cached == 1 or (not cached and held == 1)


class PageTally:
    """Counts per page of each kind of list, the number of pages whose counts are wrong, and the
    last snapshot's lists to diff the next one against."""

    def __init__(self) -> None:
        self.n = 0
        self.counts: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.right: list[bool] = []
        self.wrong = 0  # pages of 0..n-1 whose counts are wrong
        self.changes = (PageChanges(), PageChanges(), PageChanges())
        self.valid = False

    def start_over(
        self,
        n: int,
        free: Sequence[int],
        cached: Sequence[int],
        held: dict[Hashable, Sequence[int]],
    ) -> None:
        """Tally a snapshot that passed the full check (so its pages are all in 0..n-1)."""
        self.n = n
        counts = self.counts = ([0] * n, [0] * n, [0] * n)
        try:
            for kind, pages in ((FREE, free), (CACHED, cached), (HELD, chain(*held.values()))):
                row = counts[kind]
                for page in pages:
                    row[page] += 1
        except (IndexError, TypeError):  # (pages the full check let pass but a list can't
            self.valid = False  # count, such as floats: every snapshot is checked in full)
            return
        self.right = [page_ok(*c) for c in zip(*counts, strict=True)]
        self.wrong = self.right.count(False)
        self.changes[FREE].start_over({FREE: free})
        self.changes[CACHED].start_over({CACHED: cached})
        self.changes[HELD].start_over(dict(held))
        self.valid = True

    def update(
        self,
        free: Sequence[int],
        free_from: Sequence[int] | None,
        cached: Sequence[int],
        keys: list[Hashable],
        held: list[Sequence[int]],
        held_from: Sequence[Sequence[int] | None],
    ) -> tuple[bool, bool]:
        """Move to the next snapshot: (every page right, the cached list changed). A page the
        tally cannot count leaves it invalid (`start_over` again) and returns (False, ...)."""
        changes = self.changes
        changes[FREE].add(FREE, free, free_from)
        cached_changed = changes[CACHED].add(CACHED, cached)
        changes[HELD].add_many(keys, held, held_from)
        touched: list[int] = []
        n, counts = self.n, self.counts
        try:
            for kind in (FREE, CACHED, HELD):
                change = changes[kind]
                change.done()
                lost, gained = change.lost, change.gained
                change.lost, change.gained = [], []
                if not lost and not gained:
                    continue
                row = counts[kind]
                for page in lost:
                    if not 0 <= page < n:
                        raise IndexError(page)
                    row[page] -= 1
                for page in gained:
                    if not 0 <= page < n:
                        raise IndexError(page)
                    row[page] += 1
                touched += lost
                touched += gained
        except (IndexError, TypeError):  # (half counted: tallied afresh after the full check)
            self.valid = False
            return False, cached_changed
        right, (f, c, h) = self.right, counts
        for page in touched:
            now = page_ok(f[page], c[page], h[page])
            if now != right[page]:
                right[page] = now
                self.wrong += -1 if now else 1
        return not self.wrong, cached_changed

    def cached(self, pages: Sequence[int]) -> bool:
        """Every one of `pages` is cached (in 0..n-1 and counted in the cached list)."""
        n, row = self.n, self.counts[CACHED]
        return all(type(p) is int and 0 <= p < n and row[p] for p in pages)
