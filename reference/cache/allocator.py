"""The paged KV allocator."""

from __future__ import annotations

import heapq

from overlapcheck.core.errors import InvariantError


class PageAllocator:
    """Free pages, handed out lowest-first (deterministic, and reuse happens early)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = list(range(num_pages))
        self._is_free = [True] * num_pages
        self._num_flagged_free = num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise InvariantError("pages-conserved", "allocate with no free page")
        page = heapq.heappop(self._free)
        self._is_free[page] = False
        self._num_flagged_free -= 1
        return page

    def free(self, pages: list[int]) -> None:
        for page in pages:
            if self._is_free[page]:
                raise InvariantError("pages-conserved", f"page {page} freed twice")
            self._is_free[page] = True
            self._num_flagged_free += 1
            heapq.heappush(self._free, page)

    def consistent(self) -> bool:
        """The free list and the free flags agree (cheap: a count, not a scan of the list)."""
        return len(self._free) == self._num_flagged_free

    def free_pages(self) -> list[int]:
        return list(self._free)  # heap order: callers that need order sort it
