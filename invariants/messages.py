"""Invariants over the messages the scheduler sends."""

from __future__ import annotations

from overlapcheck.core.messages import AbortMsg, InMsg, OutMsg, TokenMsg, UserMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.reference.scheduler import Scheduler


class NoPostEos(Invariant):
    """No token message for a request after its finished message."""

    id = "no-post-eos"

    def __init__(self) -> None:
        self.finished: set[int] = set()

    def on_message(self, sched: Scheduler, msg: OutMsg) -> None:
        if not isinstance(msg, TokenMsg):
            return
        if msg.uid in self.finished:
            self.fail(f"token {msg.token} sent after the finished message", (msg.uid,))
        if msg.finished:
            self.finished.add(msg.uid)


class ExactLength(Invariant):
    """A request that stops on length gets exactly `max_tokens` tokens, `finished` on the last;
    one that stops earlier stops at EOS."""

    id = "exact-length"

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def on_message(self, sched: Scheduler, msg: OutMsg) -> None:
        if not isinstance(msg, TokenMsg):
            return
        n = self.counts[msg.uid] = self.counts.get(msg.uid, 0) + 1
        limit = self.run.max_output.get(msg.uid)
        if limit is None:
            return
        if n > limit:
            self.fail(f"token {n} sent, max_tokens allows {limit}", (msg.uid,))
        at_eos = msg.token == sched.config.eos_token_id and not self.run.ignore_eos.get(
            msg.uid, False
        )
        if msg.finished and n < limit and not at_eos:
            self.fail(f"finished after {n} of {limit} tokens, not at EOS", (msg.uid,))
        if n == limit and not msg.finished:
            self.fail(f"token {n} of {limit} sent without `finished`", (msg.uid,))


class AbortSilent(Invariant):
    """After an abort is processed, no more messages for that uid, and its resources come back."""

    id = "abort-silent"

    def __init__(self) -> None:
        self.aborted: dict[int, int] = {}

    def on_receive(self, sched: Scheduler, msg: InMsg) -> None:
        if isinstance(msg, AbortMsg):
            req = sched.reqs.get(msg.uid)
            if req is not None and not req.done:
                self.aborted[msg.uid] = sched.step_no
        elif isinstance(msg, UserMsg) and msg.uid in self.aborted and msg.uid not in sched.reqs:
            del self.aborted[msg.uid]  # the uid was reused by a new request

    def on_message(self, sched: Scheduler, msg: OutMsg) -> None:
        if msg.uid in self.aborted:
            step = self.aborted[msg.uid]
            self.fail(
                f"{type(msg).__name__} sent after the abort processed at step {step}", (msg.uid,)
            )

    def finish(self) -> None:
        sched = self.run.scheduler
        held = sorted(uid for uid in self.aborted if uid in sched.reqs)
        if held:
            self.fail(f"aborted requests {held} still hold resources at the end", tuple(held))
