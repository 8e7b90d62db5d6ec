"""The paged KV allocator."""

from __future__ import annotations

from overlapcheck.core.errors import InvariantError


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
        self._snapshot: tuple[int, ...] | None = None  # `free_snapshot()` until the list changes

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise InvariantError("pages-conserved", "allocate with no free page")
        page = self._free.pop()
        self._snapshot = None
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
                self._snapshot = None
                # Two sorted runs (or a few): a merge, not a full sort.
                self._free += sorted(freed, reverse=True)
                self._free.sort(reverse=True)

    def consistent(self) -> bool:
        """The free list and the free flags agree (cheap: a count, not a scan of the list)."""
        return len(self._free) == self._num_flagged_free

    def free_pages(self) -> list[int]:
        return list(self._free)  # highest first: callers that need another order sort it

    def free_snapshot(self) -> tuple[int, ...]:
        """The free list as a tuple, highest first: the same tuple until the list changes (the
        books ask at every iteration, and an unchanged list is then recognised by identity)."""
        if self._snapshot is None:
            self._snapshot = tuple(self._free)
        return self._snapshot
