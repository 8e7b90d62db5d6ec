"""Invariants over slots, pages and progress.

`slot-not-in-flight` is judged from footprints for any scheduler (a forward that uses a row for
one request while an earlier forward that used it for another is still unobserved by the host),
and also from the books when the scheduler has them. `pages-conserved` needs the books.
`liveness` is judged from the messages, and from the books when there are any.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

import numpy as np

from overlapcheck.core.messages import OutMsg
from overlapcheck.core.protocol import Books
from overlapcheck.core.trace import HOST
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request
from overlapcheck.invariants.forwards import sequence_rows


class SlotNotInFlight(Invariant):
    """A slot is never handed to a request while an in-flight batch still uses it for another."""

    id = "slot-not-in-flight"

    def __init__(self) -> None:
        self.seen = 0
        self.owner: dict[int, tuple[int, int, int, int]] = {}  # row -> uid, agent, clock, op seq

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if self.seen != len(self.run.trace.ops):  # new ops since the last message of the burst
            self._check_forwards()  # before a race on the same row is reported at this message

    def on_step_end(self) -> None:
        self._check_forwards()
        books = self.run.books()
        if books is not None:
            self._check_books(books)

    def finish(self) -> None:
        self._check_forwards()

    def _check_forwards(self) -> None:
        ops = self.run.trace.ops
        width = self.run.config.max_seq_len
        clocks = self.run.clocks
        n = clocks.advance()
        while self.seen < n:
            seq = self.seen
            self.seen += 1
            op = ops[seq]
            host_knows = clocks.host_at_issue.get(seq)
            if host_knows is None or op.agent == HOST:
                continue
            agent, vc = clocks.agent[seq], clocks.vc[seq]
            assert vc is not None  # kept for every forward
            clock = int(vc[agent])
            for uid, row in zip(op.uids, sequence_rows(op, width).tolist(), strict=False):
                prev = self.owner.get(row)
                if prev is not None and prev[0] != uid and host_knows[prev[1]] < prev[2]:
                    first = ops[prev[3]]
                    self.fail(
                        f"slot {row} used by {op.label} for request {uid} while {first.label} "
                        f"(step {first.step}), which uses it for request {prev[0]}, is still in "
                        "flight: the host has not waited for it",
                        (uid, prev[0]),
                        row=row,
                    )
                self.owner[row] = (uid, agent, clock, op.seq)

    def _check_books(self, books: Books) -> None:
        slots = Counter(h.slot for h in books.live if h.slot is not None)
        twice = sorted(s for s, n in slots.items() if n > 1)
        if twice:
            self.fail(f"slots {twice} held by two live requests at once")
        both = sorted(set(slots) & set(books.free_slots))
        if both:
            self.fail(f"slots {both} are both free and held")


class PagesConserved(Invariant):
    """free + cached + held by live requests = all pages; no page free twice, free and used, or
    held by two requests unless the prefix cache shares it (checked every step, from the books)."""

    id = "pages-conserved"
    needs_books = True
    deferrable = False

    def __init__(self) -> None:
        self._all: set[int] | None = None

    def on_step_end(self) -> None:
        books = self.run.books()  # the reference raises its own InvariantError here
        if books is not None:
            self._check(books)

    def finish(self) -> None:
        self.on_step_end()

    def _check(self, books: Books) -> None:
        if self._fast_ok(books):
            return
        self._explain(books)

    def _fast_ok(self, books: Books) -> bool:
        """The common case, in C-speed list and set operations: every page exactly once among
        free, cached and held (held pages may also be cached), locks only on cached pages."""
        n = self.run.config.num_pages
        if self._all is None or len(self._all) != n:
            self._all = set(range(n))
        # Quickest: no page shared at all. n pages listed, each of 0..n-1 once (one conversion
        # to numpy and three reductions: faster than building a set of them and comparing).
        total = len(books.free_pages) + len(books.cached_pages)
        for h in books.live:
            total += len(h.pages)
        if total == n:
            listed = chain(books.free_pages, books.cached_pages, *(h.pages for h in books.live))
            pages = np.fromiter(listed, np.int64, n)
            if n and pages.min() >= 0 and pages.max() < n and np.bincount(pages, minlength=n).min():
                return not books.locked_pages or set(books.cached_pages).issuperset(
                    books.locked_pages
                )
        # Pages shared through the prefix cache (held and cached at once) are right too.
        free = set(books.free_pages)
        cached = set(books.cached_pages)
        held: set[int] = set()
        total = 0
        for h in books.live:
            held.update(h.pages)
            total += len(h.pages)
        return (
            len(free) == len(books.free_pages)
            and len(cached) == len(books.cached_pages)
            and total == len(held)
            and free.isdisjoint(cached)
            and free.isdisjoint(held)
            and (free | cached | held) == self._all
            and cached.issuperset(books.locked_pages)
        )

    def _explain(self, books: Books) -> None:
        """Name what is wrong (or pass: pages shared between requests through the cache)."""
        n = self.run.config.num_pages
        free = np.asarray(books.free_pages, dtype=np.int64)
        cached = np.asarray(books.cached_pages, dtype=np.int64)
        held = np.concatenate(
            [np.asarray(h.pages, dtype=np.int64) for h in books.live] or [np.empty(0, np.int64)]
        )
        everything = np.concatenate([free, cached, held])
        if len(everything) and (everything.min() < 0 or everything.max() >= n):
            self.fail(f"a page number outside 0..{n - 1}")
        counts_free = np.bincount(free, minlength=n)
        if (counts_free > 1).any():
            self.fail(f"pages {np.flatnonzero(counts_free > 1)[:8].tolist()} are free twice")
        used = np.zeros(n, dtype=bool)
        used[cached] = True
        used[held] = True
        clash = np.flatnonzero(used & (counts_free > 0))
        if len(clash):
            self.fail(f"pages {clash[:8].tolist()} are both free and in use (cached or held)")
        shared = np.bincount(held, minlength=n) > 1
        is_cached = np.zeros(n, dtype=bool)
        is_cached[cached] = True
        double = np.flatnonzero(shared & ~is_cached)
        if len(double):
            self.fail(f"pages {double[:8].tolist()} held by two requests and not cached")
        locked = np.asarray(books.locked_pages, dtype=np.int64)
        if len(locked) and not is_cached[locked].all():
            self.fail(f"pages {locked[~is_cached[locked]][:8].tolist()} locked but not cached")
        lost = np.flatnonzero(~used & (counts_free == 0))
        if len(lost):
            self.fail(f"pages {lost[:8].tolist()} are lost: neither free, cached nor held")


class Liveness(Invariant):
    """Every accepted request finishes (or is aborted); once idle the scheduler holds nothing.
    (The step bound and deadlocks are enforced by the runner, under this id.)"""

    id = "liveness"

    def finish(self) -> None:
        stuck = sorted(self.run.book.live)
        if stuck:
            self.fail(f"requests {stuck} never finished", tuple(stuck))
        books = self.run.books()
        if books is None:
            return
        held = sorted(h.uid for h in books.live)
        if held:
            self.fail(f"idle scheduler still holds requests {held}", tuple(held))
        cfg = self.run.config
        if sorted(books.free_slots) != list(range(cfg.num_slots)):
            busy = sorted(set(range(cfg.num_slots)) - set(books.free_slots))
            twice = sorted({s for s in books.free_slots if books.free_slots.count(s) > 1})
            self.fail(
                f"idle scheduler's free slots are {sorted(books.free_slots)}, not all "
                f"{cfg.num_slots} once each (held: {busy}, listed twice: {twice})"
            )
        if len(set(books.free_pages) | set(books.cached_pages)) != cfg.num_pages:
            self.fail("idle scheduler holds pages outside the free list and the cache")
        if books.locked_pages:
            self.fail(
                f"idle scheduler still locks cached pages {sorted(books.locked_pages)[:8]}: "
                "a match was never unlocked, so they can never be evicted"
            )
