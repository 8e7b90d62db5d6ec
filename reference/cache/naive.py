"""No sharing: every request computes its whole prompt."""

from __future__ import annotations

from collections.abc import Sequence

from overlapcheck.reference.cache.base import CacheHandle, MatchResult, PrefixCache


class NaiveCache(PrefixCache):
    def match(self, tokens: Sequence[int]) -> MatchResult:
        return MatchResult(None, 0, [])

    def peek(self, tokens: Sequence[int]) -> int:
        return 0

    def lock(self, handle: CacheHandle | None) -> None:
        return None

    def unlock(self, handle: CacheHandle | None) -> None:
        return None

    def insert(self, tokens: Sequence[int], cells: Sequence[int]) -> int:
        return len(tokens)  # keep nothing: every page goes back to the caller

    def evict(self, num_pages: int) -> list[int]:
        return []

    @property
    def num_cached_pages(self) -> int:
        return 0

    @property
    def num_evictable_pages(self) -> int:
        return 0

    def cached_pages(self) -> list[int]:
        return []

    def locked_pages(self) -> list[int]:
        return []

    def check_integrity(self) -> None:
        return None

    def books_pages(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (), ()
