"""`pages-conserved` judged from the change between snapshots gives the full check's verdicts.

The check keeps the last snapshot that listed every page exactly once and judges the next from
what each list lost and gained (`invariants/page_changes.py`); anything else goes to the full
check. Each test here holds one check across many snapshots and compares it, step by step, with
a fresh check (which has nothing to compare with and so always judges in full): the same pass,
or the same message at the same step. The books go wrong only after many right ones, so that
the incremental path is the one that meets the fault.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Sequence
from itertools import pairwise
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.config import PreemptionKind, SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import Books, DerivedBooks, Holding, MessageSink, MessageSource
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.base import InvariantViolated
from overlapcheck.invariants.page_changes import PageChanges
from overlapcheck.invariants.resources import PagesConserved
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import named_scenario


def pages_conserved(num_pages: int) -> PagesConserved:
    check = PagesConserved()
    check.run = SimpleNamespace(  # type: ignore[assignment]
        config=SimpleNamespace(num_pages=num_pages), step=0, now=lambda: 0.0
    )
    return check


def verdict(check: PagesConserved, books: Books) -> str | None:
    try:
        check._check(books)
    except InvariantViolated as e:
        return e.violation.message
    return None


def fresh(books: Books) -> Books:
    """The same books as a user's scheduler builds them: new tuples of new lists every time."""
    return Books(
        tuple(Holding(h.uid, h.slot, tuple(list(h.pages)), h.finished) for h in books.live),
        tuple(books.free_slots),
        tuple(list(books.free_pages)),
        tuple(list(books.cached_pages)),
        tuple(list(books.locked_pages)),
        books.pending,
    )


def judged_alike(n: int, steps: list[Books]) -> list[str | None]:
    """Each step's verdict by one check carried across the steps, asserted equal to a fresh
    check's, up to the first violation (where a run stops)."""
    check = pages_conserved(n)
    verdicts = []
    for books in steps:
        got = verdict(check, books)
        assert got == verdict(pages_conserved(n), books)
        verdicts.append(got)
        if got is not None:
            break
    return verdicts


# -- generated books: legal moves between the lists, then maybe one fault -----------------------

MOVES = ("allocate", "release", "cache", "evict", "reorder", "lock", "unlock", "share", "unshare")
FAULTS = ("free-and-held", "lost", "twice-in-one-list", "negative", "past-the-end", "stranger",
          "locked-not-cached", "swap", "holding-dropped")  # fmt: skip


@st.composite
def long_books(draw: st.DrawFn) -> tuple[int, list[Books]]:
    """A pool's books over many steps. Pages go from the free list's tail to a holding's end,
    from a released holding to the free list (merged in order) or to the cache, from the cache
    back to the free list; locks come and go on cached pages; a cached page is shared by a
    holding for a while (legal, and not every page once). After the legal steps, maybe a fault:
    one list's page replaced, dropped, repeated, or a lock on a page not cached."""
    n = draw(st.integers(1, 40))
    free = list(range(n - 1, -1, -1))
    cached: list[int] = []
    locked: list[int] = []
    held: dict[int, list[int]] = {}
    shared: list[tuple[int, int]] = []  # (uid, page): cached pages a holding also lists
    next_uid = 0
    steps = []

    def snapshot() -> Books:
        return Books(
            tuple(Holding(uid, None, tuple(pages)) for uid, pages in held.items()),
            (),
            tuple(free),
            tuple(cached),
            tuple(locked),
        )

    steps.append(snapshot())
    for _ in range(draw(st.integers(1, 30))):
        move = draw(st.sampled_from(MOVES))
        if move == "allocate" and free:
            k = draw(st.integers(1, len(free)))
            uid = draw(st.sampled_from([*held, next_uid]))
            next_uid += uid == next_uid
            held.setdefault(uid, []).extend(free[len(free) - k :])
            del free[len(free) - k :]
        elif move in ("release", "cache") and held:
            uid = draw(st.sampled_from(sorted(held)))
            pages = [p for p in held.pop(uid) if (uid, p) not in shared]
            shared = [(u, p) for u, p in shared if u != uid]
            if move == "release":
                free = sorted(free + pages, reverse=True)
            else:
                cached += pages
        elif move == "evict" and cached:
            page = draw(st.sampled_from(cached))
            if page not in locked and all(p != page for _, p in shared):
                cached.remove(page)
                free = sorted([*free, page], reverse=True)
        elif move == "reorder":
            free = list(draw(st.permutations(free)))
        elif move == "lock" and cached:
            locked.append(draw(st.sampled_from(cached)))
        elif move == "unlock" and locked:
            locked.pop(draw(st.integers(0, len(locked) - 1)))
        elif move == "share" and cached and held:
            uid, page = draw(st.sampled_from(sorted(held))), draw(st.sampled_from(cached))
            held[uid].append(page)
            shared.append((uid, page))
        elif move == "unshare" and shared:
            uid, page = shared.pop(draw(st.integers(0, len(shared) - 1)))
            held[uid].remove(page)
        steps.append(snapshot())
    if draw(st.booleans()):  # a fault in a snapshot of its own, or with the last move's change
        wrong = broken(draw, n, steps[-1])
        if len(steps) > 1 and draw(st.booleans()):
            steps[-1] = wrong
        else:
            steps.append(wrong)
    return n, steps


def broken(draw: st.DrawFn, n: int, books: Books) -> Books:
    lists = [list(books.free_pages), list(books.cached_pages), *(list(h.pages) for h in books.live)]
    holdings = list(books.live)
    locked = list(books.locked_pages)
    fault = draw(st.sampled_from(FAULTS))
    nonempty = [i for i, pages in enumerate(lists) if pages]
    if fault == "holding-dropped" and holdings:  # and its pages with it: lost
        k = draw(st.integers(0, len(holdings) - 1))
        del lists[2 + k], holdings[k]
    elif fault == "locked-not-cached" or not nonempty:
        locked.append(draw(st.integers(0, n - 1)))
    else:
        i = draw(st.sampled_from(nonempty))
        j = draw(st.integers(0, len(lists[i]) - 1))
        page = lists[i][j]
        if fault == "free-and-held":
            lists[0].append(page)
        elif fault == "lost":
            lists[i].pop(j)
        elif fault == "twice-in-one-list":
            lists[i].insert(draw(st.integers(0, len(lists[i]))), page)
        elif fault == "swap":  # two pages trade places: still every page once (legal)
            k = draw(st.sampled_from(nonempty))
            m = draw(st.integers(0, len(lists[k]) - 1))
            lists[i][j], lists[k][m] = lists[k][m], lists[i][j]
        else:
            wrong = {"negative": -1, "past-the-end": n, "stranger": 10 * n + 7}.get(fault, n)
            lists[i][j] = wrong
    live = tuple(
        Holding(h.uid, h.slot, tuple(pages)) for h, pages in zip(holdings, lists[2:], strict=True)
    )
    return Books(live, (), tuple(lists[0]), tuple(lists[1]), tuple(locked))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_books())
def test_judged_from_the_change_as_in_full_at_every_step(case: tuple[int, list[Books]]) -> None:
    n, steps = case
    judged_alike(n, steps)


def claimed(steps: list[Books]) -> list[Books]:
    """The same books as `DerivedBooks` that say, of each list, that it was made from the one
    before under the same key wherever the two agree on their common length (true claims, as
    the reference's): faulty books included, so that their faults meet the claimed path."""
    out: list[Books] = []
    last: Books | None = None
    for books in steps:
        derived = tuple.__new__(DerivedBooks, books)
        if last is not None:
            held = {h.uid: h.pages for h in last.live}
            derived.free_from = _agreeing(last.free_pages, books.free_pages)
            derived.held_from = tuple(_agreeing(held.get(h.uid), h.pages) for h in books.live)
        out.append(derived)
        last = books
    return out


def _agreeing(before: Sequence[int] | None, pages: Sequence[int]) -> Sequence[int] | None:
    if before is None:
        return None
    n = min(len(before), len(pages))
    return before if tuple(before[:n]) == tuple(pages[:n]) else None


def as_views(steps: list[Books], every: int) -> list[Books]:
    """The same books with page lists as read-only int64 `memoryview`s (the reference's kind):
    every list (`every` 1), or every other one, alternating from step to step (2: a list and
    its last snapshot then differ in kind, and compare unequal)."""
    out = []
    for k, books in enumerate(steps):

        def view(pages: Sequence[int], i: int, k: int = k) -> Sequence[int]:
            return memoryview(array("q", pages)).toreadonly() if (i + k) % every == 0 else pages

        live = tuple(h._replace(pages=view(h.pages, i)) for i, h in enumerate(books.live, 3))
        free, cached = view(books.free_pages, 0), view(books.cached_pages, 1)
        out.append(Books(live, books.free_slots, free, cached, view(books.locked_pages, 2)))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_books(), st.sampled_from((1, 2)), st.booleans())
def test_page_lists_as_views_are_judged_as_the_same_tuples(
    case: tuple[int, list[Books]], every: int, claims: bool
) -> None:
    """Any immutable `Sequence[int]` will do for a page list: views (or a mix of views and
    tuples) get the verdicts tuples get, step by step, carried or fresh, claimed or not."""
    n, steps = case
    views = as_views(steps, every)
    if claims:
        steps, views = claimed(steps), claimed(views)
    assert judged_alike(n, views) == judged_alike(n, steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_books())
def test_judged_from_the_lists_they_were_made_from_as_in_full_at_every_step(
    case: tuple[int, list[Books]],
) -> None:
    n, steps = case
    judged_alike(n, claimed(steps))


def test_the_claimed_lists_do_reach_the_path_that_trusts_them() -> None:
    """Claims that change what `add` does: a list made from its last one, not the same one."""
    trusted = 0
    orig = PageChanges.add

    def counting(
        self: PageChanges, key: object, pages: tuple[int, ...], made_from: object = None
    ) -> bool:
        nonlocal trusted
        trusted += made_from is not None and made_from is self._last.get(key, ()) is not pages
        return orig(self, key, pages, made_from)  # type: ignore[arg-type]

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(long_books())
    def count(case: tuple[int, list[Books]]) -> None:
        n, steps = case
        judged_alike(n, claimed(steps))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PageChanges, "add", counting)
        count()
    assert trusted > 200


def test_the_generated_books_do_reach_the_incremental_path_and_its_faults() -> None:
    """The generator is worth something only if the carried check judges by the change."""
    incremental = faults = 0

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(long_books())
    def count(case: tuple[int, list[Books]]) -> None:
        nonlocal incremental, faults
        n, steps = case
        check = pages_conserved(n)
        for books in steps:
            based = check._based
            message = verdict(check, books)
            incremental += based and message is None and check._based
            faults += based and message is not None
            if message is not None:
                break

    count()
    assert incremental > 400 and faults > 20


# -- each fault, met on the incremental path ---------------------------------------------------

N = 20


def growing(steps: int) -> list[Books]:
    """Two requests growing by a page each from the free list's tail, page 19 cached and locked:
    every page once at every step."""
    free = list(range(N - 2, -1, -1))
    held: list[list[int]] = [[], []]
    out = []
    for _ in range(steps):
        for pages in held:
            pages.append(free.pop())
        out.append(Books(holdings(held), (), tuple(free), (N - 1,), (N - 1,)))
    return out


def holdings(held: list[list[int]]) -> tuple[Holding, ...]:
    return tuple(Holding(uid, uid, tuple(pages)) for uid, pages in enumerate(held))


def _next(last: Books) -> tuple[list[int], list[list[int]]]:
    """The next legal step's lists (each request takes a page from the free list's tail)."""
    free = list(last.free_pages)
    held = [list(h.pages) for h in last.live]
    for pages in held:
        pages.append(free.pop())
    return free, held


def wrong_next(fault: str, last: Books) -> Books:
    free, held = _next(last)
    cached, locked = last.cached_pages, last.locked_pages
    if fault == "free-and-held":
        free.append(held[0][-1])
    elif fault == "lost-at-the-tail":
        free.pop()
    elif fault == "replaced-in-the-free-middle":
        free[len(free) // 2] = held[1][0]
    elif fault == "replaced-in-a-growing-holding":
        held[0][len(held[0]) // 2] = held[1][0]
    elif fault == "replaced-after-a-head-cut":
        free, held = list(last.free_pages), [list(h.pages) for h in last.live]
        held[0].append(free.pop(0))
        free[len(free) // 2] = held[1][0]
    elif fault == "reordered-and-lost":
        free = sorted(free)[1:]
    elif fault == "holding-dropped":
        free, held = list(last.free_pages), [list(last.live[0].pages)]
    elif fault == "twice-in-its-own-list":
        held[0][-1] = held[0][0]
    elif fault == "negative":
        held[1][-1] = -1
    elif fault == "past-the-end":
        held[1][-1] = N
    elif fault == "locked-not-cached":
        locked = (*locked, held[0][0])
    elif fault == "locked-leaves-the-cache":
        free, cached = [*free, N - 1], ()
    elif fault == "shared-then-freed":  # the shared page below leaves the cache, still held
        free, held = list(last.free_pages), [list(h.pages) for h in last.live]
        free, cached, locked = [*free, N - 1], (), ()
    return Books(holdings(held), (), tuple(free), cached, locked)


UNIT_FAULTS = (
    "free-and-held", "lost-at-the-tail", "replaced-in-the-free-middle",
    "replaced-in-a-growing-holding", "replaced-after-a-head-cut", "reordered-and-lost",
    "holding-dropped", "twice-in-its-own-list", "negative", "past-the-end",
    "locked-not-cached", "locked-leaves-the-cache", "shared-then-freed",
)  # fmt: skip


@pytest.mark.parametrize("fault", UNIT_FAULTS)
def test_each_fault_met_on_the_incremental_path_is_named_as_in_full(fault: str) -> None:
    steps = growing(6)
    if fault == "shared-then-freed":  # legal: the cached page 19 is also held by request 0
        free, held = _next(steps[-1])
        held[0].append(N - 1)
        steps.append(Books(holdings(held), (), tuple(free), (N - 1,), (N - 1,)))
    check = pages_conserved(N)
    for books in steps:
        assert verdict(check, fresh(books)) is None
    assert check._based  # (a snapshot with shared pages is tallied too: `PageTally`)
    wrong = fresh(wrong_next(fault, steps[-1]))
    message = verdict(check, wrong)
    assert message is not None and message == verdict(pages_conserved(N), wrong)


def test_legal_changes_met_on_the_incremental_path_pass_there() -> None:
    """A head cut, a reordered free list, a request gone with its pages freed, a lock taken
    and given back: all judged from the change, none sent to the full check."""
    steps = growing(6)
    check = pages_conserved(N)
    for books in steps:
        check._check(fresh(books))
    free, held = _next(steps[-1])
    held[0].append(free.pop(0))
    legal = [
        Books(holdings(held), (), tuple(free), (N - 1,), (N - 1,)),
        Books(holdings(held), (), tuple(sorted(free)), (N - 1,), ()),
        Books(holdings(held[:1]), (), tuple(sorted(free + held[1])), (N - 1,), (N - 1,)),
    ]
    judged = 0
    for books in legal:
        judged += check._based and check._moved_only(fresh(books))
    assert judged == len(legal)


# -- a scheduler whose books go wrong after many right iterations -------------------------------

Fault = Callable[[Books], Books]


def _free_and_held(b: Books) -> Books:
    return Books(b.live, b.free_slots, (*b.free_pages, b.live[0].pages[0]), b.cached_pages)


def _lost(b: Books) -> Books:
    return Books(b.live, b.free_slots, b.free_pages[:-1], b.cached_pages)


def _twice_in_one_list(b: Books) -> Books:
    h = b.live[0]
    live = (h._replace(pages=(*h.pages[:-1], h.pages[0])), *b.live[1:])
    return Books(live, b.free_slots, (*b.free_pages, h.pages[-1]), b.cached_pages)


def _negative(b: Books) -> Books:
    return Books(b.live, b.free_slots, (*b.free_pages[:-1], -1), b.cached_pages)


def _past_the_end(b: Books, n: int = decode_workload().config.num_pages) -> Books:
    h = b.live[-1]
    live = (*b.live[:-1], h._replace(pages=(*h.pages[:-1], n)))
    return Books(live, b.free_slots, (*b.free_pages, h.pages[-1]), b.cached_pages)


def _replaced_as_it_grows(b: Books) -> Books:
    """A holding that grows as every iteration also has a page in its middle replaced by
    another holding's."""
    h, other, *rest = b.live
    pages = list(h.pages)
    pages[len(pages) // 2] = other.pages[0]
    return Books((h._replace(pages=tuple(pages)), other, *rest), b.free_slots, b.free_pages)


def _holding_dropped(b: Books) -> Books:
    return Books(b.live[1:], b.free_slots, b.free_pages, b.cached_pages)


def _locked_not_cached(b: Books) -> Books:
    return Books(b.live, b.free_slots, b.free_pages, b.cached_pages, (b.free_pages[0],))


def _shared_through_the_cache(b: Books) -> Books:
    """Legal: a free page moved to the cache, locked, and listed by two holdings."""
    if len(b.live) < 2 or not b.free_pages:
        return b
    page = b.free_pages[-1]
    first, second, *rest = b.live
    live = (
        first._replace(pages=(*first.pages, page)),
        second._replace(pages=(*second.pages, page)),
        *rest,
    )
    return Books(live, b.free_slots, b.free_pages[:-1], (*b.cached_pages, page), (page,))


AFTER = 100
ID = PagesConserved.id


def run_late(fault: Fault, until: int | None = None) -> RunResult:
    """The reference scheduler, its books rebuilt as fresh tuples (as a user's are), and wrong
    by `fault` from iteration `AFTER` on (until iteration `until`, if given)."""

    class LateWrongBooks(Scheduler):
        def books(self) -> Books:
            books = fresh(super().books())
            if self.step_no < AFTER or (until is not None and self.step_no >= until):
                return books
            return fresh(fault(books))

    def make(
        config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> Scheduler:
        return LateWrongBooks(config, device, source, sink)

    scenario = decode_workload(batch=4, max_tokens=160)
    return run_scenario(scenario, SimBackend(), [ID], scheduler=make)


@pytest.mark.parametrize(
    "fault",
    [
        _free_and_held,
        _lost,
        _twice_in_one_list,
        _negative,
        _past_the_end,
        _replaced_as_it_grows,
        _holding_dropped,
        _locked_not_cached,
    ],
)
def test_a_fault_after_many_right_iterations_is_named_as_in_full_at_its_step(
    fault: Fault, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged = count_judged_by_change(monkeypatch)
    [violation] = run_late(fault).violations
    assert judged[0] >= AFTER - 2  # the right iterations were judged from the change
    monkeypatch.setattr(PagesConserved, "_moved_only", lambda self, books: False)
    [in_full] = run_late(fault).violations
    assert violation.invariant == in_full.invariant == ID
    assert (violation.step, violation.message) == (in_full.step, in_full.message)
    assert AFTER - 1 <= violation.step <= AFTER


def test_legal_sharing_after_many_right_iterations_passes_and_judging_by_change_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    judged = count_judged_by_change(monkeypatch)
    result = run_late(_shared_through_the_cache)  # shared from AFTER on: judged by change too
    assert result.ok
    assert judged[0] >= result.iterations - 3  # all but the first and the moves into sharing
    judged[0] = 0
    result = run_late(_shared_through_the_cache, until=AFTER + 5)
    assert result.ok
    assert judged[0] >= result.iterations - 6  # and again once nothing is shared


def count_judged_by_change(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many snapshots `pages-conserved` passes from the change alone (a one-item list)."""
    judged = [0]
    orig = PagesConserved._moved_only

    def counting(self: PagesConserved, books: Books) -> bool:
        ok = orig(self, books)
        judged[0] += ok
        return ok

    monkeypatch.setattr(PagesConserved, "_moved_only", counting)
    return judged


@pytest.mark.parametrize(
    ("name", "preemption"),
    [
        ("shared-prefix", "none"),
        ("memory-pressure", "none"),
        ("page-size-4", "none"),
        ("preemption", "recompute"),
        ("preemption", "swap"),
    ],
)
def test_the_reference_books_keep_unchanged_lists_as_the_same_tuples(
    name: str, preemption: PreemptionKind
) -> None:
    """An unchanged free list, prefix tree or request's pages is the same tuple from one
    iteration to the next (the check then compares by identity), and every list is what the
    managers hold now."""
    seen: list[Books] = []
    copies: list[list[tuple[int, ...]]] = []  # each books' lists as tuples, when handed out
    claims = [0, 0]  # lists made from themselves (unchanged), from the last books' ones

    class Watching(Scheduler):
        def books(self) -> Books:
            books = super().books()
            prefix = self.cache.prefix
            assert tuple(books.free_pages) == tuple(self.cache.allocator.free_pages())
            assert tuple(books.cached_pages) == tuple(prefix.cached_pages())
            assert tuple(books.locked_pages) == tuple(prefix.locked_pages())
            assert [tuple(h.pages) for h in books.live] == [tuple(r.own_pages) for r in self.held]
            copies.append(as_tuples(books))
            assert isinstance(books, DerivedBooks)
            # Each list made from the last books' list (or itself), agreeing with it on their
            # common length: what pages-conserved then trusts.
            last = seen[-1] if seen else None
            before = {h.uid: h.pages for h in last.live} if last is not None else {}
            pairs = [(books.free_from, books.free_pages, last.free_pages if last else None)]
            pairs += [
                (f, h.pages, before.get(h.uid))
                for f, h in zip(books.held_from, books.live, strict=True)
            ]
            for made_from, pages, was in pairs:
                if made_from is not None:
                    assert made_from is was or made_from is pages
                    n = min(len(made_from), len(pages))
                    assert tuple(made_from[:n]) == tuple(pages[:n])
                    claims[made_from is was and was is not pages] += 1
            seen.append(books)
            return books

    scenario = named_scenario(name)
    if preemption != "none":
        scenario = scenario.with_config(preemption=preemption, page_alloc="on-demand")
    made: list[Watching] = []

    def watched(
        config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> Scheduler:
        made.append(Watching(config, device, source, sink))
        return made[-1]

    assert run_scenario(scenario, SimBackend(), [ID], scheduler=watched).ok
    assert (made[0].preemptions > 0) == (preemption != "none")
    # Snapshots that share storage with the scheduler's lists never changed afterwards.
    assert [as_tuples(b) for b in seen] == copies
    pairs = list(pairwise(seen))
    assert sum(a.free_pages is b.free_pages for a, b in pairs) > 0
    assert sum(a.cached_pages is b.cached_pages for a, b in pairs) > 0
    kept = sum(
        h.pages is g.pages and len(h.pages) > 0
        for a, b in pairs
        for h, g in zip(a.live, b.live, strict=False)
        if h.uid == g.uid
    )
    assert kept > 0 or scenario.config.page_size == 1  # (a page per token: grows every step)
    assert any(b.cached_pages for b in seen)
    assert any(b.locked_pages for b in seen) or name == "preemption"
    assert claims[0] > 0 and claims[1] > 0


def as_tuples(books: Books) -> list[tuple[int, ...]]:
    """The books' page lists, copied into tuples."""
    lists = [books.free_pages, books.cached_pages, books.locked_pages]
    return [tuple(pages) for pages in (*lists, *(h.pages for h in books.live))]


def test_books_outside_the_contract_after_right_ones_are_judged_as_in_full() -> None:
    """An unhashable uid, a page that is not a number: the full check's verdict, not a crash
    of the incremental path."""
    steps = growing(4)
    free, held = _next(steps[-1])
    odd = [
        # (and a page lost: the full check names it without hashing the uid)
        Books((Holding([0], 0, tuple(held[0])), *holdings(held)[1:]), (), tuple(free[1:])),  # type: ignore[arg-type]
        Books(holdings(held), (), (*free[:-1], "page")),  # type: ignore[arg-type]
    ]
    for books in odd:
        check = pages_conserved(N)
        for right in steps:
            check._check(right)
        try:
            expected: object = verdict(pages_conserved(N), books)
        except Exception as e:  # the full check's own answer, whatever it is
            expected = type(e)
        try:
            got: object = verdict(check, books)
        except Exception as e:
            got = type(e)
        assert got == expected


@st.composite
def list_changes(draw: st.DrawFn) -> tuple[dict[object, tuple[int, ...]], list[tuple]]:
    """Last snapshots by key, and the next one's (key, list, made_from): lists unchanged,
    grown or cut with a claim, changed otherwise with a wrong or no claim, keys repeated."""
    keys = draw(st.lists(st.integers(0, 5), min_size=1, max_size=8))
    pages = st.lists(st.integers(0, 30), max_size=6).map(tuple)
    last = {k: draw(pages) for k in set(keys) if draw(st.booleans())}
    items = []
    for key in keys:
        before = last.get(key, ())
        how = draw(st.sampled_from(("same", "grown", "cut", "other", "wrong-claim")))
        if how == "same":
            items.append((key, before, draw(st.sampled_from((None, before)))))
        elif how == "grown":
            items.append((key, before + draw(pages), before))
        elif how == "cut":
            items.append((key, before[: draw(st.integers(0, len(before)))], before))
        else:
            claim = draw(pages) if how == "wrong-claim" else None
            items.append((key, draw(pages), claim))
    return last, items


@settings(max_examples=300, deadline=None)
@given(list_changes())
def test_add_many_is_add_one_by_one(
    case: tuple[dict[object, tuple[int, ...]], list[tuple]],
) -> None:
    last, items = case
    one, many = PageChanges(), PageChanges()
    one.start_over(dict(last))
    many.start_over(dict(last))
    for key, pages, made_from in items:
        one.add(key, pages, made_from)
    many.add_many([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
    assert (many.lost, many.gained, many._next) == (one.lost, one.gained, one._next)


def test_shared_snapshots_judged_by_the_tally_as_in_full() -> None:
    """Random walks through books with pages shared through the cache (held by two requests and
    cached), some steps wrong (a page freed while held, held twice uncached, lost, locked but not
    cached, outside the pool): at every step the verdict from the tally is the full check's, and
    most legal steps are judged by the tally."""
    rng = random.Random(7)
    judged = 0
    for _ in range(40):
        check = pages_conserved(N)
        free = list(range(N))
        rng.shuffle(free)
        cached: list[int] = []
        held: list[list[int]] = [[], [], []]
        for _ in range(30):
            move = rng.random()
            if move < 0.4 and free:  # a request takes a free page
                rng.choice(held).append(free.pop())
            elif move < 0.6 and free:  # a page cached and shared by two requests
                page = free.pop()
                cached.append(page)
                for pages in rng.sample(held, 2):
                    pages.append(page)
            elif move < 0.8:  # a request finishes: its uncached pages freed
                pages = rng.choice(held)
                free.extend(p for p in pages if p not in cached)
                pages.clear()
            live = holdings(held)
            wrong = rng.random() < 0.15
            books = Books(live, (), tuple(free), tuple(cached), tuple(cached[:1]))
            if wrong:
                books = _one_wrong(books, rng)
            expected = verdict(pages_conserved(N), books)
            was_based = check._based
            got = verdict(check, books)
            assert got == expected
            judged += was_based and got is None and check._based and not check._once
    assert judged > 300


def _one_wrong(books: Books, rng: random.Random) -> Books:
    free, cached, live = list(books.free_pages), list(books.cached_pages), list(books.live)
    kind = rng.randrange(5)
    if kind == 0 and live[0].pages:  # a held page also free
        free.append(live[0].pages[0])
    elif kind == 1 and free:  # a free page held by two requests, uncached
        page = free.pop()
        live[0] = live[0]._replace(pages=(*live[0].pages, page))
        live[1] = live[1]._replace(pages=(*live[1].pages, page))
    elif kind == 2 and free:  # a page lost
        free.pop()
    elif kind == 3 and free:  # a free page locked
        return books._replace(locked_pages=(free[0],))
    else:  # a page outside the pool
        free.append(N + 3)
    return books._replace(free_pages=tuple(free), cached_pages=tuple(cached), live=tuple(live))
