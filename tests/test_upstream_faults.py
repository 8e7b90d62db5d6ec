"""Each named fault against a hand-written scenario of the upstream situation it names.

Per fault: the exact message stream with the fault on (what upstream's users saw), the stream with
it off (the fix), and the normal loop with the fault on where upstream's normal loop hid the bug.
Messages are delivered at scheduler iterations ("the abort arrives on the 2nd receive" is
iteration 1), so the same scenario reaches the same state in both loops. The toy model is scripted
(`continuation`), so the tokens are literal; EOS is 2. Races that need a slow stream to land get a
delay on one kind of operation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.core.config import LoopKind, SchedulerConfig
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.messages import AbortMsg, InMsg, OutMsg, TokenMsg
from overlapcheck.core.scenario import RequestSpec, Scenario, user_msg
from overlapcheck.core.units import US
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference.faults import FAULTS, PREEMPTION_FAULT_CONFIG
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.source import IterationSource

Stream = list[tuple[int, int, bool]]  # (uid, token, finished) per message


@dataclass(frozen=True)
class KindDelay:
    """Every operation of one kind (`forward`, `h2d`, `d2h`, a host phase) takes `extra` more."""

    kind: str
    extra: float

    def delay(self, site: int, kind: str, nominal: float) -> float:
        return self.extra if kind == self.kind else 0.0


@dataclass(frozen=True)
class Case:
    """An upstream situation: requests, and at which receive (iteration) each message arrives."""

    config: SchedulerConfig
    requests: tuple[RequestSpec, ...]
    arrivals: tuple[tuple[int, int], ...]  # (iteration, uid): the request arrives
    aborts: tuple[tuple[int, int], ...] = ()  # (iteration, uid): its abort arrives
    delay: KindDelay | None = None

    def with_(self, fault: str | None, loop: LoopKind = "overlap") -> Case:
        faults = frozenset([fault] if fault else [])
        return replace(self, config=replace(self.config, faults=faults, loop=loop))

    def backend(self) -> SimBackend:
        return SimBackend(Timing(source=self.delay) if self.delay else Timing())

    def deliveries(self) -> list[tuple[int, int, str]]:
        return [(i, uid, "user") for i, uid in self.arrivals] + [
            (i, uid, "abort") for i, uid in self.aborts
        ]

    def scenario(self) -> Scenario:
        return Scenario("upstream", self.config, self.requests)


def stream(case: Case) -> tuple[Stream, InvariantError | None]:
    """Every message the scheduler sends, no invariant stopping it (the scheduler's own books are
    checked after each iteration and at the end; the first failure is returned, not raised)."""
    specs = {s.uid: s for s in case.requests}
    schedule: list[tuple[int, InMsg]] = [(i, user_msg(specs[uid])) for i, uid in case.arrivals]
    schedule += [(i, AbortMsg(uid)) for i, uid in case.aborts]
    device = case.backend().make_device(case.scenario())
    source = IterationSource(schedule, lambda: sched.step_no)
    out: list[OutMsg] = []
    sched = Scheduler(case.config, device, source, out.append)
    broken: InvariantError | None = None
    try:
        while sched.step() and sched.step_no < 100:
            if broken is None:
                try:
                    sched.check_integrity()
                except InvariantError as err:
                    broken = err
    except InvariantError as err:
        broken = broken or err
    msgs = [(m.uid, m.token, m.finished) for m in out if isinstance(m, TokenMsg)]
    return msgs, broken


def checked(case: Case, only: tuple[str, ...] | None = None) -> RunResult:
    """The same scenario through the runner, every invariant on (or `only` these)."""
    return run_scenario(case.scenario(), case.backend(), only, case.deliveries())


def caught(case: Case, only: tuple[str, ...] | None = None) -> str | None:
    """The first invariant the run breaks (all on, or `only` these), None when clean."""
    result = checked(case, only)
    return result.violations[0].invariant if result.violations else None


CFG = SchedulerConfig(num_slots=2, num_pages=32, max_seq_len=32)
PROMPT = (5, 6, 7, 8, 9)

# -- finish-by-can-decode -----------------------------------------------------------------------

LENGTH = Case(
    CFG, (RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 42, 43, 44)),), ((0, 1),)
)


def test_finish_by_can_decode_delivers_every_token_with_the_last_two_finished() -> None:
    on = LENGTH.with_("finish-by-can-decode")
    assert stream(on) == ([(1, 41, False), (1, 42, False), (1, 43, True), (1, 44, True)], None)
    assert caught(on) == "exact-length"
    off = LENGTH.with_(None)
    assert stream(off) == ([(1, 41, False), (1, 42, False), (1, 43, False), (1, 44, True)], None)
    assert caught(off) is None


def test_finish_by_can_decode_with_one_or_two_tokens() -> None:
    one = Case(CFG, (RequestSpec(1, PROMPT, max_tokens=1, continuation=(41,)),), ((0, 1),))
    assert stream(one.with_("finish-by-can-decode")) == ([(1, 41, True)], None)
    two = Case(CFG, (RequestSpec(1, PROMPT, max_tokens=2, continuation=(41, 42)),), ((0, 1),))
    assert stream(two.with_("finish-by-can-decode")) == ([(1, 41, True), (1, 42, True)], None)


def test_finish_by_can_decode_is_exact_in_the_normal_loop() -> None:
    normal = LENGTH.with_("finish-by-can-decode", loop="normal")
    assert stream(normal) == stream(LENGTH.with_(None))
    assert caught(normal) is None


# -- reply-after-finish -------------------------------------------------------------------------

EOS_EARLY = Case(CFG, (RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 2, 43)),), ((0, 1),))


def test_reply_after_finish_sends_the_stale_token_unfinished() -> None:
    on = EOS_EARLY.with_("reply-after-finish")
    assert stream(on) == ([(1, 41, False), (1, 2, True), (1, 43, False)], None)
    assert caught(on) == "no-post-eos"
    off = EOS_EARLY.with_(None)
    assert stream(off) == ([(1, 41, False), (1, 2, True)], None)
    assert caught(off) is None
    normal = EOS_EARLY.with_("reply-after-finish", loop="normal")
    assert stream(normal) == stream(off) and caught(normal) is None


def test_reply_after_finish_marks_the_stale_token_finished_when_it_is_the_last_allowed() -> None:
    # EOS on token 3 of 4: the stale round is the 4th, so upstream's `finished` was True again
    case = Case(
        CFG, (RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 42, 2, 44)),), ((0, 1),)
    )
    on = case.with_("reply-after-finish")
    assert stream(on)[0] == [(1, 41, False), (1, 42, False), (1, 2, True), (1, 44, True)]


# -- free-slot-early ----------------------------------------------------------------------------

# One slot. Request 1 stops at EOS in round 2 (D2) while D3 is launched; request 2 arrives on the
# 4th receive, while D3 is still in flight.
SLOT_REUSE = Case(
    SchedulerConfig(num_slots=1, num_pages=32, max_seq_len=32),
    (
        RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 2)),
        RequestSpec(2, (10, 11, 12), max_tokens=3, continuation=(51, 52, 53)),
    ),
    ((0, 1), (3, 2)),
)
SLOT_REUSE_STREAM = [(1, 41, False), (1, 2, True), (2, 51, False), (2, 52, False), (2, 53, True)]


def test_free_slot_early_hands_the_slot_over_while_the_extra_round_runs() -> None:
    on = SLOT_REUSE.with_("free-slot-early")
    # The messages are right at nominal timing: the race is on cells the two rounds both touch.
    assert stream(on) == (SLOT_REUSE_STREAM, None)
    result = checked(on)
    assert result.violations[0].invariant == "slot-not-in-flight"
    assert "still in flight" in result.violations[0].message
    assert caught(on, only=("no-race",)) == "no-race"  # the same bug, as a race on page_table
    off = SLOT_REUSE.with_(None)
    assert stream(off) == (SLOT_REUSE_STREAM, None)
    assert caught(off) is None
    normal = SLOT_REUSE.with_("free-slot-early", loop="normal")
    assert stream(normal) == (SLOT_REUSE_STREAM, None) and caught(normal) is None


# -- abort-inflight-prefill ---------------------------------------------------------------------

# A 5-token prompt prefilled in one batch; the abort arrives on the 2nd receive, with the prefill
# launched and its result not processed yet.
ABORT = Case(
    CFG,
    (RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 42, 43, 44)),),
    ((0, 1),),
    ((1, 1),),
)


def test_abort_inflight_prefill_caches_twice_and_still_sends_the_token() -> None:
    on = ABORT.with_("abort-inflight-prefill")
    msgs, broken = stream(on)
    assert msgs == [(1, 41, False)]  # the prefill's token, sent after the abort
    assert broken is not None and broken.invariant == "pages-conserved"
    assert "free and cached" in broken.detail
    # online, the token is seen first; the books are checked at the end of that iteration
    assert caught(on) == "abort-silent"
    assert caught(on, only=("pages-conserved",)) == "pages-conserved"
    off = ABORT.with_(None)
    assert stream(off) == ([], None)
    assert caught(off) is None


def test_abort_inflight_prefill_is_clean_in_the_normal_loop() -> None:
    # The normal loop processed the prefill in the iteration that launched it: the token came
    # before the abort, and the abort finds nothing in flight.
    normal = ABORT.with_("abort-inflight-prefill", loop="normal")
    assert stream(normal) == ([(1, 41, False)], None)
    assert caught(normal) is None


def test_abort_inflight_prefill_with_a_cached_prefix_unlocks_below_zero() -> None:
    shared = Case(
        CFG,
        (
            RequestSpec(0, (5, 6, 7, 8), max_tokens=1, continuation=(31,)),
            RequestSpec(1, PROMPT, max_tokens=4, continuation=(41, 42, 43, 44)),
        ),
        ((0, 0), (3, 1)),
        ((4, 1),),
    )
    msgs, broken = stream(shared.with_("abort-inflight-prefill"))
    assert msgs == [(0, 31, True)]  # upstream asserted on the lock count before replying
    assert broken is not None and "unlock of an unlocked node" in broken.detail
    assert stream(shared.with_(None)) == ([(0, 31, True)], None)


def test_abort_during_a_non_final_chunk_is_harmless_with_the_fault() -> None:
    chunked = Case(
        SchedulerConfig(num_slots=2, num_pages=32, max_seq_len=32, max_extend_tokens=4),
        (RequestSpec(1, tuple(range(10, 22)), max_tokens=4),),
        ((0, 1),),
        ((1, 1),),
    )
    assert stream(chunked.with_("abort-inflight-prefill")) == ([], None)
    assert caught(chunked.with_("abort-inflight-prefill")) is None


# -- chunk-sample-overwrite ---------------------------------------------------------------------

# An 8-token prompt in two chunks of 4: chunk 1's sample lands on token_pool[slot, 4], the first
# prompt token of chunk 2, after chunk 2's prompt was copied in.
CHUNKED = Case(
    SchedulerConfig(num_slots=1, num_pages=32, max_seq_len=32, max_extend_tokens=4),
    (RequestSpec(1, (5, 6, 7, 8, 9, 10, 11, 12), max_tokens=3, continuation=(41, 42, 43)),),
    ((0, 1),),
)
CHUNKED_STREAM = [(1, 41, False), (1, 42, False), (1, 43, True)]


def test_chunk_sample_overwrite_corrupts_the_next_chunk() -> None:
    on = CHUNKED.with_("chunk-sample-overwrite")
    # chunk 2 computed its KV from the sample instead of token 9: every later token differs
    assert stream(on) == ([(1, 1014, False), (1, 124, False), (1, 471, True)], None)
    assert caught(on) == "no-race"
    assert caught(on, only=("oracle",)) == "oracle"
    assert stream(CHUNKED.with_(None)) == (CHUNKED_STREAM, None)
    assert caught(CHUNKED.with_(None)) is None
    normal = CHUNKED.with_("chunk-sample-overwrite", loop="normal")
    assert stream(normal) == (CHUNKED_STREAM, None) and caught(normal) is None


# -- staging-buffer-reuse -----------------------------------------------------------------------

# The scheduler stream's copies are slow, so batch N's metadata copy has not run when the host
# plans batch N+1 into the same pinned buffer.
STAGING = Case(
    SchedulerConfig(num_slots=2, num_pages=32, max_seq_len=32),
    (RequestSpec(1, PROMPT, max_tokens=3, continuation=(41, 42, 43)),),
    ((0, 1),),
    delay=KindDelay("h2d", 300 * US),
)
PLAIN_STREAM = [(1, 41, False), (1, 42, False), (1, 43, True)]


def test_staging_buffer_reuse_gives_a_batch_its_successors_metadata() -> None:
    on = STAGING.with_("staging-buffer-reuse")
    assert stream(on) == ([(1, 599, False), (1, 948, False), (1, 948, True)], None)
    assert caught(on) == "no-race"
    assert caught(on, only=("oracle",)) == "oracle"
    assert stream(STAGING.with_(None)) == (PLAIN_STREAM, None)
    assert caught(STAGING.with_(None)) is None
    normal = STAGING.with_("staging-buffer-reuse", loop="normal")
    assert stream(normal) == (PLAIN_STREAM, None) and caught(normal) is None


# -- copy-done-wrong-stream ---------------------------------------------------------------------

# A slow forward: an event on the scheduler stream fires long before the D2H of the samples. Not
# overlap-specific: upstream's `record()` took the current stream, the engine stream in both loops
# (so upstream was right by context); the fault records on the scheduler stream in both loops.
SLOW_FORWARD = Case(
    SchedulerConfig(num_slots=2, num_pages=32, max_seq_len=32),
    (RequestSpec(1, PROMPT, max_tokens=3, continuation=(41, 42, 43)),),
    ((0, 1),),
    delay=KindDelay("forward", 300 * US),
)


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_copy_done_wrong_stream_reads_the_samples_before_they_land(loop: LoopKind) -> None:
    on = SLOW_FORWARD.with_("copy-done-wrong-stream", loop=loop)
    # the host reads the output buffer before the D2H: -1, what the buffer held
    assert stream(on) == ([(1, -1, False), (1, -1, False), (1, -1, True)], None)
    assert caught(on) == "no-race"
    assert caught(on, only=("oracle",)) == "oracle"
    off = SLOW_FORWARD.with_(None, loop=loop)
    assert stream(off) == (PLAIN_STREAM, None) and caught(off) is None


def test_every_fault_has_a_scenario_here() -> None:
    # the preemption faults have theirs in tests/test_preemption.py, those of speculative
    # decoding in tests/test_speculative.py, those of ranks in tests/test_ranks.py
    speculative = {name for name, f in FAULTS.items() if f.speculative}
    ranks = {name for name, f in FAULTS.items() if f.ranks}
    assert set(FAULTS) - set(PREEMPTION_FAULT_CONFIG) - speculative - ranks == {
        "finish-by-can-decode",
        "reply-after-finish",
        "free-slot-early",
        "abort-inflight-prefill",
        "chunk-sample-overwrite",
        "staging-buffer-reuse",
        "copy-done-wrong-stream",
    }
