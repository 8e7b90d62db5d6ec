"""The harness calls each check's hooks only where they can judge something: inactive checks
get no calls, `ended_only` checks no tokens of live requests, `on_ops` only after new ops."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.expected import ExactTokens
from overlapcheck.core.messages import OutMsg, RejectMsg, SamplingParams, TokenMsg, UserMsg
from overlapcheck.harness.stepping import Checks
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request, RequestLedger
from overlapcheck.invariants.oracle import Oracle


class Heard(Invariant):
    def __init__(self, ended_only: bool = False, active: bool = True) -> None:
        self.ended_only, self.active = ended_only, active
        self.messages: list[tuple[str, int]] = []
        self.ops = 0

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        self.messages.append((type(msg).__name__, msg.uid))

    def on_ops(self) -> None:
        self.ops += 1


def test_each_check_hears_the_messages_it_can_judge() -> None:
    ledger = RequestLedger(SchedulerConfig())
    every, ended, idle = Heard(), Heard(ended_only=True), Heard(active=False)
    checks = Checks([every, ended, idle], keep_going=True)
    ledger.receive(UserMsg(1, (5, 6), SamplingParams(max_tokens=2)), 0, lambda msg, n: None)
    sent: list[tuple[OutMsg, int]] = [
        (TokenMsg(1, 7, False), 3),  # live: ops issued before it
        (TokenMsg(1, 8, True), 3),  # live still when it came; no new ops
        (TokenMsg(1, 9, False), 4),  # after the finish: late
        (TokenMsg(2, 9, False), 4),  # a uid never received
        (RejectMsg(1, "busy"), 5),
    ]
    for msg, num_ops in sent:
        checks.message(msg, ledger.answer(msg, 0, num_ops), num_ops)
    assert every.messages == [
        ("TokenMsg", 1),
        ("TokenMsg", 1),
        ("TokenMsg", 1),
        ("TokenMsg", 2),
        ("RejectMsg", 1),
    ]
    assert ended.messages == [("TokenMsg", 1), ("TokenMsg", 2), ("RejectMsg", 1)]
    assert every.ops == ended.ops == 3  # at the first message and after each new op
    assert idle.messages == [] and idle.ops == 0


def test_a_check_that_judges_no_routine_token_hears_only_the_others() -> None:
    """`judges_routine = False`: no call for a live request's token before its last one that is
    not EOS (`RequestLedger.routine`); the last token, an EOS, a late token and a rejection
    still reach it, and every token reaches a check that judges them all."""
    ledger = RequestLedger(SchedulerConfig())  # EOS is 2
    every, quiet = Heard(), Heard()
    quiet.judges_routine = False
    checks = Checks([every, quiet], keep_going=True)
    ledger.receive(UserMsg(1, (5, 6), SamplingParams(max_tokens=4)), 0, lambda msg, n: None)
    sent: list[OutMsg] = [
        TokenMsg(1, 7, False),  # routine
        TokenMsg(1, 2, False),  # EOS, not finished: not routine
        TokenMsg(1, 8, False),  # routine (ignore_eos is off, but the output is not over yet)
        TokenMsg(1, 9, True),  # the last one
        TokenMsg(1, 9, False),  # after the finish: late
        RejectMsg(1, "busy"),
    ]
    routine = []
    for msg in sent:
        req = ledger.answer(msg, 0, 3)
        routine.append(ledger.routine)
        checks.message(msg, req, 3, ledger.routine)
    assert routine == [True, False, True, False, False, False]
    assert len(every.messages) == 6
    assert quiet.messages == [("TokenMsg", 1), ("TokenMsg", 1), ("TokenMsg", 1), ("RejectMsg", 1)]


def test_a_token_off_the_reference_is_not_routine_and_reaches_the_oracle() -> None:
    """A routine token is also the reference's token there (when the request has exact ones), so
    the oracle, which judges no routine token, still hears every wrong one, mid-output too."""
    ledger = RequestLedger(SchedulerConfig())  # EOS is 2
    oracle = Oracle()
    oracle.run = cast(Any, SimpleNamespace(step=0, now=lambda: 0.0))  # what `fail` reads
    checks = Checks([oracle], keep_going=True)
    reference = ExactTokens([7, 8, 9, 10])
    ledger.receive(UserMsg(1, (5, 6), SamplingParams(max_tokens=4)), 0, lambda m, n: reference)
    routine = []
    for msg in (TokenMsg(1, 7, False), TokenMsg(1, 4, False), TokenMsg(1, 9, False)):
        req = ledger.answer(msg, 0, 3)
        routine.append(ledger.routine)
        checks.message(msg, req, 3, ledger.routine)
    assert routine == [True, False, True]
    assert [v.invariant for v in checks.violations] == ["oracle"]
    assert "token #2 = 4, the reference says 8" in checks.violations[0].message
