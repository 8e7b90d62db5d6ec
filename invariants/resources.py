"""Invariants over slots, pages and progress.

`slot-not-in-flight` is judged from footprints for any scheduler (a row handed to a new request by
copies or a forward unordered by happens-before with the last forward that used it for another),
and also from the books when the scheduler has them. `pages-conserved` needs the books.
`liveness` is judged from the messages, and from the books when there are any.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from itertools import chain

import numpy as np

from overlapcheck.core.protocol import Books, DerivedBooks
from overlapcheck.core.trace import HOST, PAGE_TABLE, TOKEN_POOL, Op, Release
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.locations import (
    locations,
    op_location,
    release_location,
    where,
)
from overlapcheck.invariants.page_arrays import PageArrays
from overlapcheck.invariants.page_changes import PageChanges
from overlapcheck.invariants.page_tally import PageTally

_ROW_BUFFERS = (TOKEN_POOL, PAGE_TABLE)  # the buffers a slot is a row of
_min, _max = np.minimum.reduce, np.maximum.reduce
_NONE_FROM: tuple[Sequence[int] | None, ...] = ()


class SlotNotInFlight(Invariant):
    """A slot is never handed to a request while a launched forward still uses it for another.

    Judged from happens-before, as `no-race` is: when a forward uses a row for a new request, every
    write into that row's `token_pool` or `page_table` cells issued since the old request's last
    forward (the new request's copies), and the new forward itself, must be ordered after that
    forward. Whether the host has waited for it does not matter: copies queued behind it on its
    own stream (vLLM's single-stream discipline) are ordered, copies on another stream without a
    wait are not.
    """

    id = "slot-not-in-flight"
    batched = True  # False: every sequence judged one by one (the same verdicts, for comparison)

    def __init__(self) -> None:
        self.seen = 0  # ops judged
        self.taken = 0  # of the run's forwards (`ForwardIndex`), judged
        self.owner: dict[int, tuple[int, int, int, int]] = {}  # row -> uid, agent, clock, op seq
        # The last forward's uids and rows (distinct), each row owned by its uid: the next
        # forward of the same pairs only moves their owners' last forward to `batch_at`
        # (agent, clock, op seq), booked in `owner` when the pairs change.
        self.batch_uids: tuple[int, ...] = ()
        self.batch_rows: list[int] = []
        self.batch_at = (0, 0, 0)

    def on_ops(self) -> None:
        if self.seen != len(self.run.trace.ops):
            self._check_forwards()  # before a race on the same row is reported at this message

    def on_step_end(self) -> None:
        self.on_ops()
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
        if self.seen == n:
            return
        index, shapes, owner = self.run.forwards, self.run.shapes, self.owner
        index.update(ops)
        forwards, places = index.forwards, index.places
        for k in range(self.taken, len(forwards)):
            # a finding here leaves the next call to go on after this forward
            seq, self.taken, self.seen = places[k], k + 1, places[k] + 1
            op = forwards[k]
            if op.agent == HOST:
                continue
            agent, vc = clocks.agent[seq], clocks.vc[seq]
            assert vc is not None  # kept for every forward
            clock = int(vc[agent])
            uids, rows = op.uids, shapes.lists(op)[0]
            if uids == self.batch_uids and rows == self.batch_rows:
                # Every row's owner again (a decode batch's every step): nothing to judge, and
                # the owners' last forward is this one (`_settle` books it per row).
                self.batch_at = (agent, clock, op.seq)
                continue
            self._settle()
            for uid, row in zip(uids, rows, strict=False):
                prev = owner.get(row)
                if prev is not None and prev[0] != uid:
                    unordered = self._unordered_use(prev, seq, row, width)
                    if unordered is not None:
                        self._report(ops[prev[3]], ops[unordered], op, uid, prev[0], row)
                owner[row] = (uid, agent, clock, op.seq)
            if self.batched and len(uids) == len(rows) == len(set(rows)):
                self.batch_uids, self.batch_rows = uids, rows
                self.batch_at = (agent, clock, op.seq)
        self.seen = n

    def _settle(self) -> None:
        """Book the batch's last forward as its rows' owners' (`batch_uids`)."""
        if self.batch_rows:
            at, owner = self.batch_at, self.owner
            for uid, row in zip(self.batch_uids, self.batch_rows, strict=True):
                owner[row] = (uid, *at)
        self.batch_uids, self.batch_rows = (), []

    def _unordered_use(
        self, prev: tuple[int, int, int, int], seq: int, row: int, width: int
    ) -> int | None:
        """The first op from the old owner's forward to the new one's (`seq`, included) that
        writes `row` (or is that forward) and is not ordered after the old owner's forward."""
        _, p_agent, p_clock, p_seq = prev
        clocks, ops = self.run.clocks, self.run.trace.ops
        lo, hi = row * width, (row + 1) * width
        for i in range(p_seq + 1, seq + 1):
            if clocks.agent[i] == p_agent:
                continue  # program order on the old forward's own agent
            vc = clocks.vc[i]
            if vc is None or vc[p_agent] >= p_clock:
                continue
            if i == seq or any(
                a.mode == "w"
                and a.buffer in _ROW_BUFFERS
                and len(a.cells)
                and bool(((a.cells >= lo) & (a.cells < hi)).any())
                for a in ops[i].accesses
            ):
                return i
        return None

    def _report(self, first: Op, use: Op, op: Op, uid: int, old: int, row: int) -> None:
        slot = self.run.term("slot")
        how = (
            f"it runs on {use.agent}, unordered with it"
            if use is op
            else f"`{use.label or use.kind}` (step {use.step}, {use.agent}) writes the row "
            "unordered with it"
        )
        freed = self._release(row, first.seq, use.seq)
        found = locations(
            release_location(freed),
            op_location("reused", use),
            op_location("in flight", first),
        )
        when = "" if freed is None else f"; it was freed at step {freed.step}"
        self.fail(
            f"{slot} {row} used by {op.label} for request {uid} while {first.label} (step "
            f"{first.step}), which uses it for request {old}, is still in flight: {how} (no wait "
            f"on an event recorded after {first.label} on {first.agent}){when}"
            + (f" [{where(found)}]" if found else ""),
            (uid, old),
            found,
            row=row,
        )

    def _release(self, row: int, after: int, by: int) -> Release | None:
        """The scheduler's last release of slot `row` (`Device.released`) between two ops."""
        for release in reversed(self.run.trace.releases):
            if release.at <= after:
                return None
            if release.at <= by and release.resource == "slot" and row in release.ids:
                return release
        return None

    def _check_books(self, books: Books) -> None:
        slots = [h.slot for h in books.live if h.slot is not None]
        held = set(slots)
        if len(held) != len(slots):
            twice = sorted(s for s, n in Counter(slots).items() if n > 1)
            self.fail(f"slots {twice} held by two live requests at once")
        both = held.intersection(books.free_slots)
        if both:
            self.fail(f"slots {sorted(both)} are both free and held")


class PagesConserved(Invariant):
    """free + cached + held by live requests = all pages; no page free twice, free and used, or
    held by two requests unless the prefix cache shares it (checked every step, from the books)."""

    id = "pages-conserved"
    needs_books = True
    deferrable = False

    def __init__(self) -> None:
        self._all: set[int] | None = None
        self._arrays = PageArrays()  # the books' lists as arrays, from one step to the next
        # Since the last snapshot that passed, one of two bases to judge the next one's change
        # from: where it listed every page exactly once, its lists (the cheapest: the pages
        # lost and gained must be the same); where pages were shared through the cache, how
        # often each page is listed free, cached and held (`PageTally`). And its locked pages.
        self._changes = PageChanges()
        self._tally = PageTally()
        self._once = False  # the base is `_changes` (True) or `_tally` (when valid)
        self._locked: Sequence[int] = ()

    @property
    def _based(self) -> bool:
        """The next snapshot can be judged from its change (the last one passed: a base kept)."""
        return self._once or self._tally.valid

    def on_step_end(self) -> None:
        books = self.run.books()  # the reference raises its own InvariantError here
        if books is not None:
            self._check(books)

    def finish(self) -> None:
        self.on_step_end()

    def _check(self, books: Books) -> None:
        if self._based and self._judged_by_change(books):
            return
        once = self._once_each(books)
        self._once, self._tally.valid = once is True, False
        if once:
            self._changes.start_over(self._lists(books))
            self._locked = books.locked_pages
            return
        if once is None and self._shared_ok(books):
            lists = self._lists(books)
            free, cached = lists.pop("free"), lists.pop("cached")
            self._tally.start_over(self.run.config.num_pages, free, cached, lists)
            self._locked = books.locked_pages
            return
        self._explain(books)

    def _judged_by_change(self, books: Books) -> bool:
        try:
            return self._moved_only(books)
        except TypeError:  # a uid or page the books' contract does not allow: judged in full
            self._changes.start_over({})
            self._tally.valid = False
            return False

    def _moved_only(self, books: Books) -> bool:
        """Judged from the change since the last snapshot that passed, against its base: where
        every page was listed once, every page a list lost another list gained (so every page is
        still listed exactly once); where pages were shared, the counts of the pages a list lost
        or gained move, and those pages are judged again (`PageTally`). The locked pages are
        looked at when they or the cache changed. False sends the snapshot to the full check
        (which says what is wrong, or passes what the tally could not count)."""
        live = books.live
        free_from, held_from = None, _NONE_FROM
        if type(books) is DerivedBooks:  # the scheduler says which lists it made from which
            free_from, held_from = books.free_from, books.held_from
        if len(held_from) != len(live):
            held_from = (None,) * len(live)
        keys: list[Hashable] = [h.uid for h in live]
        if len(set(keys)) != len(keys):  # a second holding of one uid (a broken scheduler's)
            seen: set[Hashable] = set()  # is another list
            keys = []
            for i, h in enumerate(live):
                keys.append(h.uid if h.uid not in seen else (h.uid, i))
                seen.add(h.uid)
        held = [h.pages for h in live]
        if self._once:
            changes = self._changes
            changes.add("free", books.free_pages, free_from)
            cached_changed = changes.add("cached", books.cached_pages)
            changes.add_many(keys, held, held_from)
            changes.done()
            right = changes.moved_only()
        else:
            tally = self._tally
            right, cached_changed = tally.update(
                books.free_pages, free_from, books.cached_pages, keys, held, held_from
            )
        if not right:
            return False
        locked = books.locked_pages
        if (
            locked
            and (cached_changed or locked != self._locked)
            and not (
                set(books.cached_pages).issuperset(locked)
                if self._once
                else self._tally.cached(locked)
            )
        ):
            return False
        self._locked = locked
        return True

    @staticmethod
    def _lists(books: Books) -> dict[Hashable, Sequence[int]]:
        """The books' page lists by key: free, cached, and each holding by uid (a second
        holding of one uid, a broken scheduler's, is another list)."""
        lists: dict[Hashable, Sequence[int]] = {
            "free": books.free_pages,
            "cached": books.cached_pages,
        }
        for i, h in enumerate(books.live):
            lists[h.uid if h.uid not in lists else (h.uid, i)] = h.pages
        return lists

    def _fast_ok(self, books: Books) -> bool:
        """The common case, in C-speed list and set operations: every page exactly once among
        free, cached and held (held pages may also be cached), locks only on cached pages."""
        once = self._once_each(books)
        return once if once is not None else self._shared_ok(books)

    def _once_each(self, books: Books) -> bool | None:
        """Quickest: no page shared at all. n pages listed, each of 0..n-1 once (one conversion
        to numpy and three reductions: faster than building a set of them and comparing); then
        True when the locked pages are cached, False when not. None: not every page once."""
        n = self.run.config.num_pages
        total = len(books.free_pages) + len(books.cached_pages)
        for h in books.live:
            total += len(h.pages)
        if total == n:
            pages = self._listed(books)
            # (ufunc reductions: the array methods' Python wrappers cost more than the work)
            if n and _min(pages) >= 0 and _max(pages) < n and _min(np.bincount(pages, minlength=n)):
                return not books.locked_pages or set(books.cached_pages).issuperset(
                    books.locked_pages
                )
        return None

    def _shared_ok(self, books: Books) -> bool:
        """Pages shared through the prefix cache (held and cached at once) are right too."""
        n = self.run.config.num_pages
        if self._all is None or len(self._all) != n:
            self._all = set(range(n))
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
            and (total == len(held) or cached.issuperset(_held_twice(books)))
            and free.isdisjoint(cached)
            and free.isdisjoint(held)
            and (free | cached | held) == self._all
            and cached.issuperset(books.locked_pages)
        )

    def _listed(self, books: Books) -> np.ndarray:
        """Every page the books list (free, cached, held), as one array."""
        arrays = self._arrays
        parts = [arrays.array("free", books.free_pages), arrays.array("cached", books.cached_pages)]
        seen: set[int] = set()
        for i, h in enumerate(books.live):
            # By uid (a request's pages from one step to the next); a second holding of one uid
            # (a broken scheduler's) is another list.
            parts.append(arrays.array(h.uid if h.uid not in seen else (h.uid, i), h.pages))
            seen.add(h.uid)
        arrays.done()
        return np.concatenate(parts)

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


def _held_twice(books: Books) -> set[int]:
    """Pages listed more than once among the holdings (legal when the prefix cache shares them)."""
    counts = Counter(chain.from_iterable(h.pages for h in books.live))
    return {page for page, n in counts.items() if n > 1}


class Liveness(Invariant):
    """Every accepted request finishes (or is aborted); once idle the scheduler holds nothing.
    (The step bound and deadlocks are enforced by the runner, under this id.)"""

    id = "liveness"

    def finish(self) -> None:
        stuck = sorted(self.run.ledger.live)
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
