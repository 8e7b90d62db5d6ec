"""Each check's fast path agrees with its slow path on generated inputs.

The race detector checks a whole operation in one vectorised step (`_op`) and falls back to one
access at a time (`_access`) to name a race; `pages-conserved` accepts the common case with list
and set operations (`_fast_ok`) before `_explain` looks for what is wrong; the reference cache
manager counts pages (`pages_add_up`) before naming the page at fault (`page_fault`). A fast path
that accepts what its slow path rejects hides a bug; one that rejects the common legal case costs
the slow path on every step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import SeededDelay, Timing
from overlapcheck.backends.sim.toy_model import ToyModel
from overlapcheck.core.protocol import Books, Holding
from overlapcheck.core.trace import HOST, KV_OFFLOAD, TOKEN_POOL, Access, Op, Trace
from overlapcheck.harness.runner import run_scenario
from overlapcheck.invariants.base import InvariantViolated
from overlapcheck.invariants.context import Attribution
from overlapcheck.invariants.forward_shape import ForwardIndex, ShapeCache
from overlapcheck.invariants.forwards import ForwardFeed
from overlapcheck.invariants.page_arrays import PageArrays
from overlapcheck.invariants.progress import _starts
from overlapcheck.invariants.races import Race, RaceDetector, VectorClock
from overlapcheck.invariants.resources import PagesConserved, SlotNotInFlight
from overlapcheck.reference.cache.manager import page_fault, pages_add_up
from overlapcheck.scenarios.named import named_scenario
from overlapcheck.scenarios.strategies import scenarios

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class OneByOne(RaceDetector):
    """The race detector with its fast path off: every op access by access."""

    def _op(self, op: Op, a: int, vc: VectorClock) -> Race | None:
        return self._one_by_one(op, a, vc, op.accesses)

    def _host_op(self, op: Op, acc: Access, vc: VectorClock) -> Race | None:
        return self._one_by_one(op, 0, vc, op.accesses)


def all_races(detector: RaceDetector, trace: Trace) -> list[Race]:
    """Every race, in issue order: the detector goes on after each one it reports."""
    found = []
    while (race := detector.check(trace)) is not None:
        found.append(race)
    return found


def describe(trace: Trace) -> str:
    lines = [f"sizes {trace.sizes}"]
    for op in trace.ops:
        acc = " ".join(f"{a.mode}:{a.buffer}{a.cells.tolist()}" for a in op.accesses)
        lines.append(f"{op.seq} {op.agent} rec={op.records} wait={op.waits} {acc}")
    return "\n".join(lines)


BUFFERS = ("a", "b", "c")
AGENTS = (HOST, "scheduler", "engine", "copy")


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Ops of four agents over three small buffers: reads and writes in any order within an op,
    repeated cells, events recorded and waited for, buffer sizes declared or not (a declared size
    is the recorder's promise that every access stays below it: `Trace.sizes`)."""
    trace = Trace()
    top = {}
    for name in BUFFERS:
        size = draw(st.sampled_from((None, 4, 16)))
        top[name] = 20 if size is None else size - 1
        if size is not None:
            trace.sizes[name] = size
    recorded: list[int] = []
    for seq in range(draw(st.integers(1, 30))):
        accesses = []
        for _ in range(draw(st.integers(0, 3))):
            buffer = draw(st.sampled_from(BUFFERS))
            cells = draw(st.lists(st.integers(0, top[buffer]), max_size=6))
            mode = draw(st.sampled_from(("r", "w")))
            accesses.append(Access(buffer, np.array(cells, dtype=np.int64), mode))
        waits = draw(st.sampled_from(recorded)) if recorded and draw(st.booleans()) else None
        records = None
        if draw(st.integers(0, 3)) == 0:
            records = trace.new_event_id()
            recorded.append(records)
        agent = draw(st.sampled_from(AGENTS))
        trace.add(Op(seq, agent, "op", 0, "", 0.0, accesses=accesses, records=records, waits=waits))
    return trace


@FAST
@given(traces())
def test_the_race_detectors_fast_path_reports_what_access_by_access_reports(trace: Trace) -> None:
    note(describe(trace))
    assert all_races(RaceDetector(), trace) == all_races(OneByOne(), trace)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(faults=frozenset({"free-slot-early"})) | scenarios(), st.integers(0, 2**16))
def test_the_race_detector_agrees_with_itself_on_simulated_runs(scenario: Any, seed: int) -> None:
    trace = run_scenario(scenario, SimBackend(Timing(source=SeededDelay(seed))), []).trace
    assert all_races(RaceDetector(), trace) == all_races(OneByOne(), trace)


def pages_conserved(num_pages: int) -> PagesConserved:
    check = PagesConserved()
    check.run = SimpleNamespace(  # type: ignore[assignment]
        config=SimpleNamespace(num_pages=num_pages), step=0, now=lambda: 0.0
    )
    return check


def explained_ok(check: PagesConserved, books: Books) -> bool:
    try:
        check._explain(books)
    except InvariantViolated:
        return False
    return True


@st.composite
def legal_books(draw: st.DrawFn) -> tuple[int, Books]:
    """Books a correct scheduler could report: each page free, cached (maybe locked), held by one
    request, or cached and shared by the requests that matched it, each list in any order."""
    n = draw(st.integers(0, 24))
    requests = draw(st.integers(0, 4))
    free: list[int] = []
    cached: list[int] = []
    locked: list[int] = []
    held: list[list[int]] = [[] for _ in range(requests)]
    for page in range(n):
        role = draw(st.sampled_from(("free", "cached", "held", "shared")))
        if role == "held" and requests:
            held[draw(st.integers(0, requests - 1))].append(page)
        elif role == "shared" and requests:
            cached.append(page)
            holders = draw(st.sets(st.integers(0, requests - 1), min_size=1))
            for r in sorted(holders):
                held[r].append(page)
            if draw(st.booleans()):
                locked.append(page)
        elif role in ("cached", "shared"):
            cached.append(page)
            if draw(st.booleans()):
                locked.append(page)
        else:
            free.append(page)
    live = tuple(
        Holding(uid, uid, tuple(draw(st.permutations(pages)))) for uid, pages in enumerate(held)
    )
    books = Books(
        live,
        (),
        tuple(draw(st.permutations(free))),
        tuple(draw(st.permutations(cached))),
        tuple(draw(st.permutations(locked))),
    )
    return n, books


@st.composite
def any_books(draw: st.DrawFn) -> tuple[int, Books]:
    """Books of a broken scheduler: pages repeated, missing, out of range, locked but not cached."""
    n = draw(st.integers(0, 12))
    pages = st.lists(st.integers(-1, n + 1), max_size=n + 3)
    live = tuple(Holding(uid, uid, tuple(draw(pages))) for uid in range(draw(st.integers(0, 3))))
    return n, Books(live, (), tuple(draw(pages)), tuple(draw(pages)), tuple(draw(pages)))


@FAST
@given(legal_books())
def test_pages_conserved_passes_legal_books_on_its_fast_path(case: tuple[int, Books]) -> None:
    n, books = case
    check = pages_conserved(n)
    assert check._fast_ok(books)
    assert explained_ok(check, books)


@FAST
@given(any_books() | legal_books())
def test_pages_conserved_fast_path_accepts_only_what_its_slow_path_accepts(
    case: tuple[int, Books],
) -> None:
    n, books = case
    check = pages_conserved(n)
    if check._fast_ok(books):
        assert explained_ok(check, books)


@st.composite
def page_counts(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[tuple[int, int]]]:
    """A pool's free list as the allocator keeps it (distinct pages of the pool), cached and held
    pages as a cache manager may have them wrong: repeated, free as well, missing, strangers."""
    n = draw(st.integers(0, 12))
    free = draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True, max_size=n)) if n else []
    rest = [p for p in range(n) if p not in free]
    shuffled = draw(st.permutations(rest))
    split = draw(st.integers(0, len(shuffled)))
    cached = list(shuffled[:split])
    held = [(draw(st.integers(0, 3)), p) for p in shuffled[split:]]
    if draw(st.booleans()):  # break it
        extra = st.integers(-1, n + 1)
        cached += draw(st.lists(extra, max_size=2))
        held += [(0, p) for p in draw(st.lists(extra, max_size=2))]
        if cached and draw(st.booleans()):
            cached.pop(draw(st.integers(0, len(cached) - 1)))
    return n, free, cached, held


@FAST
@given(page_counts())
def test_the_cache_managers_page_count_agrees_with_naming_the_page_at_fault(
    case: tuple[int, list[int], list[int], list[tuple[int, int]]],
) -> None:
    n, free, cached, held = case
    busy = cached + [p for _, p in held]
    assert pages_add_up(n, free, busy) == (page_fault(n, free, cached, held) is None)


@st.composite
def page_list_edits(draw: st.DrawFn) -> list[tuple[int, ...]]:
    """Successive snapshots of one page list: each the last one grown at its end, cut at its
    head or tail, unchanged, or anything else."""
    pages = tuple(draw(st.lists(st.integers(-2, 40), max_size=8)))
    out = [pages]
    for _ in range(draw(st.integers(1, 8))):
        edit = draw(st.sampled_from(("grow", "head", "tail", "same", "other")))
        k = draw(st.integers(0, len(pages)))
        if edit == "grow":
            pages = pages + tuple(draw(st.lists(st.integers(-2, 40), max_size=4)))
        elif edit == "head":
            pages = pages[k:]
        elif edit == "tail":
            pages = pages[:k]
        elif edit == "other":
            pages = tuple(draw(st.lists(st.integers(-2, 40), max_size=8)))
        out.append(tuple(list(pages)))  # a new tuple of the same ints, as a fresh snapshot is
    return out


@FAST
@given(st.lists(page_list_edits(), min_size=1, max_size=3))
def test_page_arrays_are_always_exactly_the_snapshot(lists: list[list[tuple[int, ...]]]) -> None:
    arrays = PageArrays()
    for step in range(max(len(snapshots) for snapshots in lists)):
        for key, snapshots in enumerate(lists):
            if step < len(snapshots):
                got = arrays.array(key, snapshots[step])
                assert got.dtype == np.int64 and got.tolist() == list(snapshots[step])
        arrays.done()


@st.composite
def books_over_steps(draw: st.DrawFn) -> tuple[int, list[Books]]:
    """Books of one pool over a few steps: pages taken from the free list's tail onto a
    holding's end (an allocation), or the books replaced by any others of the pool."""
    n, books = draw(legal_books())
    steps = [books]
    for _ in range(draw(st.integers(1, 5))):
        free, live = list(books.free_pages), list(books.live)
        k = draw(st.integers(0, len(free)))
        if live and draw(st.booleans()):
            i = draw(st.integers(0, len(live) - 1))
            taken = tuple(free[len(free) - k :])
            live[i] = Holding(live[i].uid, live[i].slot, live[i].pages + taken)
            books = Books(tuple(live), (), tuple(free[: len(free) - k]), books.cached_pages)
        else:
            pages = st.lists(st.integers(-1, n + 1), max_size=n + 2)
            books = Books(books.live, (), tuple(draw(pages)), tuple(draw(pages)))
        steps.append(books)
    return n, steps


@FAST
@given(books_over_steps())
def test_pages_conserved_judges_each_step_as_a_fresh_check_would(
    case: tuple[int, list[Books]],
) -> None:
    n, steps = case
    check = pages_conserved(n)
    for books in steps:  # one check across steps: its page arrays carry over
        assert check._fast_ok(books) == pages_conserved(n)._fast_ok(books)


def slot_check() -> SlotNotInFlight:
    check = SlotNotInFlight()
    check.run = SimpleNamespace(step=3, now=lambda: 0.0)  # type: ignore[assignment]
    return check


def slot_books(held: list[int | None], free: tuple[int, ...]) -> Books:
    live = tuple(Holding(uid, slot, ()) for uid, slot in enumerate(held))
    return Books(live=live, free_slots=free, free_pages=())


@pytest.mark.parametrize(
    ("held", "free", "message"),
    [
        ([0, 1, None], (2, 3), None),
        ([0, 1, 1, 0, 2], (3,), "slots [0, 1] held by two live requests at once"),
        ([0, 2], (3, 2, 1), "slots [2] are both free and held"),
    ],
)
def test_slot_books_name_the_slots_held_twice_or_both_free_and_held(
    held: list[int | None], free: tuple[int, ...], message: str | None
) -> None:
    check = slot_check()
    if message is None:
        check._check_books(slot_books(held, free))
        return
    with pytest.raises(InvariantViolated) as err:
        check._check_books(slot_books(held, free))
    assert err.value.violation.message == message


@FAST
@given(
    prompt=st.lists(st.integers(0, 499), max_size=40),
    eos_probability=st.sampled_from([0.0, 0.05, 0.5]),
    ignore_eos=st.booleans(),
    scripted=st.lists(st.integers(0, 499), max_size=4),
)
def test_the_streamed_reference_is_the_model_run_on_each_whole_context(
    prompt: list[int], eos_probability: float, ignore_eos: bool, scripted: list[int]
) -> None:
    """`ToyModel.generate` feeds each token to running hashers; the device hashes each context it
    reads whole. Both must give the same tokens, scripted continuations and EOS coins included."""
    model = ToyModel(500, 2, seed=7, eos_probability=eos_probability)
    if scripted:
        model.add_script(prompt, scripted)
    out = model.generate(prompt, 30, ignore_eos)
    context, whole = list(prompt), []
    while len(whole) < 30:
        whole.append(model.next_token(np.asarray(context)))
        context.append(whole[-1])
        if whole[-1] == model.eos and not ignore_eos:
            break
    assert out == whole


# -- the run's index of forwards, for progress, work-bound and slot-not-in-flight ---------------

KINDS = ("forward", "h2d", KV_OFFLOAD, "record", "wait", "d2h")


@st.composite
def op_batches(draw: st.DrawFn) -> list[list[Op]]:
    """Ops issued in batches (a pull between two), of every kind, some forwards on the host,
    some offloads naming no request."""
    batches, seq = [], 0
    for _ in range(draw(st.integers(1, 8))):
        batch = []
        for _ in range(draw(st.integers(0, 12))):
            kind = draw(st.sampled_from(KINDS))
            uids = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
            agent = draw(st.sampled_from((HOST, "engine", "scheduler")))
            batch.append(Op(seq, agent, kind, 0, "", 0.0, uids=uids))
            seq += 1
        batches.append(batch)
    return batches


@FAST
@given(op_batches(), st.data())
def test_every_feed_gets_each_forward_with_the_requests_of_its_time(
    batches: list[list[Op]], data: st.DataObject
) -> None:
    """The run's forwards are attributed once (`Attribution`) for every check's feed: each feed,
    pulled whenever, gets every forward once, in issue order, with the request each of its uids
    named when it was issued (a uid booked again later does not take over its earlier forwards)."""
    trace = Trace()
    run = SimpleNamespace(trace=trace, attribution=Attribution(ForwardIndex()))
    eager, lazy = ForwardFeed(), ForwardFeed()
    expected: list[Any] = []
    got_eager: list[Any] = []
    got_lazy: list[Any] = []
    current: dict[int, Any] = {}
    for batch in batches:
        for op in batch:
            trace.add(op)
            if op.kind == "forward":
                expected.append((op, tuple(current.get(uid) for uid in op.uids)))
        got_eager += eager.pull(run)  # type: ignore[arg-type]
        assert eager.seen == len(trace.ops)
        assert eager.pull(run) == []  # type: ignore[arg-type]  # nothing new
        if data.draw(st.booleans()):
            got_lazy += lazy.pull(run)  # type: ignore[arg-type]
        uid = data.draw(st.integers(0, 5))
        req = SimpleNamespace(uid=uid, rejection=None, aborted_step=None)
        run.attribution.received(trace.ops, req)
        current[uid] = req
    got_lazy += lazy.pull(run)  # type: ignore[arg-type]
    assert got_eager == got_lazy == expected
    ops, index = trace.ops, run.attribution.index
    assert index.forwards == [op for op in ops if op.kind == "forward"]
    assert index.places == [i for i, op in enumerate(ops) if op.kind == "forward"]
    assert index.offloads == [op for op in ops if op.kind == KV_OFFLOAD and op.uids]


def numpy_starts(op: Op, ends: np.ndarray, width: int) -> np.ndarray:
    """`progress`'s first new position of each sequence, as it was computed in numpy."""
    read = next((a.cells for a in op.accesses if a.buffer == TOKEN_POOL and a.mode == "r"), None)
    if read is None or len(read) == len(ends):
        return ends - 1
    rows = read // width
    begins = np.flatnonzero(np.diff(rows, prepend=-1) != 0)
    if len(begins) != len(ends):
        return ends - 1
    starts: np.ndarray = read[begins] % width
    return starts


@pytest.mark.parametrize("name", ["preemption", "shared-prefix", "chunked-long"])
def test_progress_finds_each_forwards_starts_as_numpy_did(name: str) -> None:
    scenario = named_scenario(name)
    if name == "preemption":
        scenario = scenario.with_config(preemption="recompute", page_alloc="on-demand")
    result = run_scenario(scenario, SimBackend(), [])
    width = scenario.config.max_seq_len
    forwards = [op for op in result.trace.ops if op.kind == "forward"]
    assert forwards
    shapes = ShapeCache(width)
    for op in forwards:
        rows, ends = shapes.lists(op)
        assert (rows, ends) == (shapes.rows(op).tolist(), shapes.ends(op).tolist())
        assert _starts(op, ends, width) == numpy_starts(op, shapes.ends(op), width).tolist()
    # prefills and recomputes among them, not only one new token each
    assert any(
        _starts(op, e, width) != [x - 1 for x in e]
        for op in forwards
        for e in [shapes.ends(op).tolist()]
    )
