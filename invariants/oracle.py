"""Every request's tokens equal the sequential reference (the model run on the request alone)."""

from __future__ import annotations

from overlapcheck.core.messages import OutMsg, TokenMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.reference.scheduler import Scheduler


class Oracle(Invariant):
    id = "oracle"

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def on_message(self, sched: Scheduler, msg: OutMsg) -> None:
        if not isinstance(msg, TokenMsg):
            return
        k = self.seen.get(msg.uid, 0)
        self.seen[msg.uid] = k + 1
        expected = self.run.reference_tokens(msg.uid)
        if expected is None:
            return
        if k >= len(expected):
            self.fail(
                f"token #{k + 1} = {msg.token}, the reference ends after {len(expected)}",
                (msg.uid,),
            )
        if not self.run.token_matches(msg.uid, k, msg.token):
            self.fail(
                f"token #{k + 1} = {msg.token}, the reference says {expected[k]}",
                (msg.uid,),
                position=k,
                got=msg.token,
                expected=expected[k],
            )
