"""Request slots: rows of `token_pool` and `page_table` on the device."""

from __future__ import annotations

import heapq

from overlapcheck.core.errors import InvariantError


class TableManager:
    """Hands out slots lowest-first, so that reuse happens as early as possible (and is tested)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots))
        heapq.heapify(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise InvariantError("slot-not-in-flight", f"slot {slot} freed twice or out of range")
        heapq.heappush(self._free, slot)

    def free_slots(self) -> list[int]:
        return sorted(self._free)
