"""The prefix cache contract, shared by the naive and radix caches.

A match returns a handle; while the handle is locked its pages cannot be evicted. The caller owns
the pages it allocated itself until it inserts them: `insert` takes ownership of the pages it keeps
and returns how many leading tokens were already cached, whose pages the caller must free (they are
duplicates). Eviction only ever frees unlocked pages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple


class CacheHandle:
    """An opaque position in the cache (for the radix cache, the node the match ended at)."""


class MatchResult(NamedTuple):
    handle: CacheHandle | None
    length: int  # matched tokens, a multiple of the page size
    cells: list[int]  # KV cell per matched position


class PrefixCache(ABC):
    @abstractmethod
    def match(self, tokens: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `tokens` (page-aligned). Does not lock."""

    @abstractmethod
    def peek(self, tokens: Sequence[int]) -> int:
        """Length of the longest cached prefix of `tokens` (page-aligned), with no side effect: no
        split, no LRU touch. Scheduling policies rank waiting requests with it; only admission
        (`match`) may change the tree."""

    @abstractmethod
    def lock(self, handle: CacheHandle | None) -> None:
        """Protect the match from eviction until `unlock`."""

    @abstractmethod
    def unlock(self, handle: CacheHandle | None) -> None: ...

    @abstractmethod
    def insert(self, tokens: Sequence[int], cells: Sequence[int]) -> int:
        """Cache `tokens` (page-aligned) whose KV lives in `cells`; returns the length already
        cached before, whose pages stay with the caller (to free)."""

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Drop least-recently-used unlocked leaves until `num_pages` pages are freed (or none is
        left); returns the freed pages."""

    @property
    @abstractmethod
    def num_cached_pages(self) -> int: ...

    @property
    @abstractmethod
    def num_evictable_pages(self) -> int: ...

    @abstractmethod
    def cached_pages(self) -> list[int]: ...

    @abstractmethod
    def locked_pages(self) -> list[int]:
        """Cached pages a lock pins (a live request matched them): never evicted, never freed."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise `InvariantError` naming the broken invariant of the cache's own structure."""

    def books_pages(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`check_integrity`, then the cached and the locked pages as the books list them."""
        self.check_integrity()
        return tuple(self.cached_pages()), tuple(self.locked_pages())
