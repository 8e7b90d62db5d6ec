"""The paged KV allocator."""

from __future__ import annotations

from overlapcheck.core.errors import InvariantError
from overlapcheck.reference.cache.snapshots import PageSnapshots


class PageAllocator:
    """Free pages, handed out lowest-first (deterministic, and reuse happens early).

    The free list is kept in descending order and allocation takes its last page: consecutive
    `free_pages()` snapshots then differ by a cut-off tail, which `pages-conserved` recognises
    instead of converting the whole list again.
    """

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages
        self._num_flagged_free = num_pages
        # `free_snapshot()`'s: reset when pages are freed; after allocations only, the free
        # list is a prefix of the last one. `snapshot_from`: see `free_snapshot`.
        self._snapshots = PageSnapshots()
        self.snapshot_from: memoryview | None = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise InvariantError("pages-conserved", "allocate with no free page")
        page = self._free.pop()  # (the snapshots stay: the list is a prefix of the last)
        self._is_free[page] = False
        self._num_flagged_free -= 1
        return page

    def free(self, pages: list[int]) -> None:
        freed: list[int] = []
        try:
            for page in pages:
                if self._is_free[page]:
                    raise InvariantError("pages-conserved", f"page {page} freed twice")
                self._is_free[page] = True
                self._num_flagged_free += 1
                freed.append(page)
        finally:  # the pages before a double free are free, as when freed one by one
            if freed:
                self._snapshots.reset()
                # Two sorted runs (or a few): a merge, not a full sort.
                self._free += sorted(freed, reverse=True)
                self._free.sort(reverse=True)

    def consistent(self) -> bool:
        """The free list and the free flags agree (cheap: a count, not a scan of the list)."""
        return len(self._free) == self._num_flagged_free

    def free_pages(self) -> list[int]:
        return list(self._free)  # highest first: callers that need another order sort it

    def free_snapshot(self) -> memoryview:
        """The free list, highest first, as an immutable snapshot (a read-only int64
        `memoryview`, `cache/snapshots.py`): the same object until the list changes (the books
        ask at every iteration, and an unchanged list is then recognised by identity). After
        allocations only, a shorter view of the last one's storage, not a copy. `snapshot_from`
        is then what it was made from: that one, itself (unchanged), or None (made afresh)."""
        snapshot, self.snapshot_from = self._snapshots.after_pops(self._free)
        return snapshot
