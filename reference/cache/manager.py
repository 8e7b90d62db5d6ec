"""The cache manager: the page allocator, a prefix cache, and the page bookkeeping of requests."""

from __future__ import annotations

from collections.abc import Iterable

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import InvariantError
from overlapcheck.reference.cache.allocator import PageAllocator
from overlapcheck.reference.cache.base import PrefixCache
from overlapcheck.reference.cache.naive import NaiveCache
from overlapcheck.reference.cache.radix import RadixCache
from overlapcheck.reference.req import Req


class CacheManager:
    def __init__(self, config: SchedulerConfig) -> None:
        self.page_size = config.page_size
        self.num_pages = config.num_pages
        self.allocator = PageAllocator(config.num_pages)
        self.prefix: PrefixCache = (
            RadixCache(config.page_size) if config.cache == "radix" else NaiveCache()
        )

    @property
    def available_pages(self) -> int:
        """Pages a new allocation could get: free ones plus unlocked cached ones."""
        return self.allocator.num_free + self.prefix.num_evictable_pages

    def attach_prefix(self, req: Req) -> None:
        """Match the prompt (never its last token: one position must be computed to sample) and
        lock the match into the request."""
        match = self.prefix.match(req.fill[:-1])
        self.prefix.lock(match.handle)
        req.handle, req.cached_len, req.cells = match.handle, match.length, list(match.cells)
        req.kv_len = req.table_len = 0

    def detach_prefix(self, req: Req) -> None:
        """Undo `attach_prefix` for a request that was not admitted after all."""
        self.prefix.unlock(req.handle)
        req.handle, req.cached_len, req.cells = None, 0, []

    def grow(self, req: Req, num_positions: int) -> None:
        """Give `req` KV cells up to `num_positions`, page by page, evicting when needed.

        Admission reserved these pages, so running out here is a scheduler bug.
        """
        ps = self.page_size
        while len(req.cells) < num_positions:
            if self.allocator.num_free == 0:
                self.allocator.free(self.prefix.evict(1))
            page = self.allocator.allocate()
            req.own_pages.append(page)  # (the books' last snapshot stays its prefix)
            req.cells += range(page * ps, page * ps + ps)

    def release(self, req: Req, forget: bool = True) -> None:
        """Return a request's pages: cache what it computed (radix), free the rest, unlock.

        `forget=False` keeps the request's books (pages, handle) as they were: only the
        `abort-inflight-prefill` fault does that, to release the same request twice as upstream did.
        """
        tokens = req.known_tokens()
        usable = len(tokens) // self.page_size * self.page_size
        already = self.prefix.insert(tokens[:usable], req.cells[:usable])
        kept = set(req.cells[already : usable : self.page_size]) if usable > already else set()
        # Pages before `cached_len` belong to the tree; the request's own pages are freed unless
        # the tree just took them.
        to_free = [p for p in req.own_pages if p * self.page_size not in kept]
        self.allocator.free(to_free)
        self.prefix.unlock(req.handle)
        if forget:
            req.handle, req.own_pages, req.cells = None, [], []
            req.books_pages.reset()

    def check_integrity(self, live: Iterable[Req]) -> None:
        """free + cached + held by live requests == all pages, and no page is counted twice."""
        self.prefix.check_integrity()
        cached = self.prefix.cached_pages()
        live = list(live)
        free = self.allocator.free_pages()
        busy = list(cached)
        for req in live:
            busy.extend(req.own_pages)
        if pages_add_up(self.num_pages, free, busy) and self.allocator.consistent():
            return
        held = [(req.uid, page) for req in live for page in req.own_pages]
        fault = page_fault(self.num_pages, free, cached, held)
        raise InvariantError(
            "pages-conserved", fault or "the allocator's free list and free flags disagree"
        )


def pages_add_up(num_pages: int, free: list[int], busy: list[int]) -> bool:
    """The fast path, in C-speed set operations: every page of 0..num_pages-1 exactly once among
    `free` and `busy` (cached, then held). It relies on the free list holding no duplicate and no
    stranger, which the allocator guarantees (it refuses a double free and hands out its own)."""
    distinct = set(busy)
    return (
        len(free) + len(busy) == num_pages
        and len(distinct) == len(busy)
        and distinct.isdisjoint(free)
        and (not distinct or (min(distinct) >= 0 and max(distinct) < num_pages))
    )


def page_fault(
    num_pages: int, free: list[int], cached: list[int], held: list[tuple[int, int]]
) -> str | None:
    """The slow path, only on failure: the first page counted twice, outside the pool, or lost,
    named with its owners (`held`: (uid, page) pairs); None when every page is there once."""
    owners: dict[int, list[str]] = {}
    for page in free:
        owners.setdefault(page, []).append("free")
    for page in cached:
        owners.setdefault(page, []).append("cached")
    for uid, page in held:
        owners.setdefault(page, []).append(f"held by request {uid}")
    for page in range(num_pages):
        who = owners.get(page, [])
        if len(who) > 1:
            return f"page {page} is {' and '.join(who)}"
    strangers = sorted(p for p in owners if not 0 <= p < num_pages)
    if strangers:
        return f"pages {strangers[:8]} are outside 0..{num_pages - 1}"
    missing = [p for p in range(num_pages) if p not in owners][:8]
    return f"pages {missing} are lost" if missing else None
