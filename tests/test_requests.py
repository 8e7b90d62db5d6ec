"""Rejections (with the scheduler state unchanged) and aborts in every state."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import (
    AbortMsg,
    InMsg,
    OutMsg,
    RejectMsg,
    SamplingParams,
    TokenMsg,
    UserMsg,
)
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import run_scenario
from overlapcheck.reference.req import ReqState
from overlapcheck.reference.scheduler import Scheduler

US = 1e-6


class ScriptedSource:
    """Messages handed over at given scheduler iterations (not times): exact control of state."""

    def __init__(self, by_step: dict[int, list[InMsg]]) -> None:
        self.by_step = by_step
        self.sched: Scheduler | None = None

    def poll(self, now: float) -> list[InMsg]:
        assert self.sched is not None
        return self.by_step.pop(self.sched.step_no, [])

    def next_arrival(self) -> float | None:
        return 0.0 if self.by_step else None


def make(
    config: SchedulerConfig, by_step: dict[int, list[InMsg]]
) -> tuple[Scheduler, list[OutMsg]]:
    scenario = Scenario("t", config, (RequestSpec(0, (5,)),))
    device = SimBackend().make_device(scenario)
    source = ScriptedSource(by_step)
    out: list[OutMsg] = []
    sched = Scheduler(config, device, source, out.append)
    source.sched = sched
    return sched, out


def user(
    uid: int, n: int = 4, max_tokens: int = 4, tokens: tuple[int, ...] | None = None
) -> UserMsg:
    return UserMsg(
        uid, tokens if tokens is not None else tuple(range(10, 10 + n)), SamplingParams(max_tokens)
    )


CFG = SchedulerConfig(num_slots=2, num_pages=16, max_seq_len=16, vocab_size=64)


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (user(1, tokens=()), "empty prompt"),
        (user(1, tokens=(5, 64)), "token id 64 outside the vocabulary of 64"),
        (user(1, tokens=(5, -1)), "token id -1 outside the vocabulary of 64"),
        (user(1, n=16), "prompt of 16 tokens leaves no room"),
        (user(1, max_tokens=0), "max_tokens must be >= 1"),
        (user(1, n=12, max_tokens=4), "needs 16 KV pages, the device has 15"),
    ],
)
def test_rejections_leave_the_state_unchanged(msg: UserMsg, reason: str) -> None:
    cfg = (
        SchedulerConfig(num_slots=2, num_pages=15, max_seq_len=17, vocab_size=64)
        if "KV" in reason
        else CFG
    )
    sched, out = make(cfg, {0: [msg]})
    sched.step()
    assert len(out) == 1 and isinstance(out[0], RejectMsg) and reason in out[0].reason
    assert not sched.held and sched.table.num_free == cfg.num_slots
    assert sched.cache.allocator.num_free == cfg.num_pages


def test_a_live_uid_is_rejected_and_the_live_request_is_untouched() -> None:
    sched, out = make(CFG, {0: [user(1)], 1: [user(1, n=2)]})
    sched.run_until_idle()
    rejects = [m for m in out if isinstance(m, RejectMsg)]
    tokens = [m for m in out if isinstance(m, TokenMsg)]
    assert [r.reason for r in rejects] == ["uid 1 is already live"]
    assert len(tokens) == 4 and tokens[-1].finished


def test_abort_of_an_unknown_uid_is_ignored() -> None:
    sched, out = make(CFG, {0: [AbortMsg(99), user(1)]})
    sched.run_until_idle()
    assert len(out) == 4


def run_with_abort(
    abort_step: int, config: SchedulerConfig = CFG, n: int = 4
) -> tuple[Scheduler, list[OutMsg], ReqState]:
    """Submit one request at step 0, abort it at `abort_step`; returns the state it had."""
    sched, out = make(config, {0: [user(1, n=n, max_tokens=6)]})
    seen: list[ReqState] = []
    while sched.step():
        if sched.step_no == abort_step:
            req = sched.live.get(1)
            seen.append(req.state if req else ReqState.FINISHED)
            sched.source.by_step[abort_step] = [AbortMsg(1)]  # type: ignore[attr-defined]
    sched.check_integrity()
    assert not sched.held and sched.table.num_free == config.num_slots
    return sched, out, seen[0]


def test_abort_while_pending() -> None:
    sched, out = make(CFG, {0: [user(1), AbortMsg(1)]})
    sched.run_until_idle()
    assert out == [] and not sched.held


def test_abort_mid_chunk_with_the_chunk_in_flight() -> None:
    cfg = SchedulerConfig(
        num_slots=2, num_pages=32, max_seq_len=32, vocab_size=64, max_extend_tokens=4
    )
    _, out, state = run_with_abort(1, cfg, n=12)
    assert state is ReqState.PREFILLING
    assert out == []


def test_abort_while_running_with_a_batch_in_flight() -> None:
    _, out, state = run_with_abort(3)
    assert state is ReqState.RUNNING
    assert 0 < len(out) < 6 and not any(isinstance(m, TokenMsg) and m.finished for m in out)


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_abort_in_every_state_through_the_runner(loop: str) -> None:
    reqs = (
        RequestSpec(0, tuple(range(10, 50)), max_tokens=4, abort_at=100 * US),  # mid-chunk
        RequestSpec(1, (5, 6, 7), max_tokens=20, abort_at=700 * US),  # running
        RequestSpec(2, (8, 9), max_tokens=3, arrival=10 * US, abort_at=10 * US),  # pending
        RequestSpec(3, (8, 9, 10), max_tokens=3, abort_at=9000 * US),  # after finishing
    )
    cfg = SchedulerConfig(num_slots=2, num_pages=64, max_seq_len=64, max_extend_tokens=8, loop=loop)
    result = run_scenario(Scenario("aborts", cfg, reqs), SimBackend())
    assert result.ok, [v.line() for v in result.violations]
    reasons = {o.uid: o.finish_reason for o in result.outcomes}
    assert reasons == {0: "abort", 1: "abort", 2: "abort", 3: "length"}
