"""Every request's tokens equal its expected output: the oracle, the model run on the request alone.

The messages call it "the reference", the word users of the oracle check already read."""

from __future__ import annotations

from overlapcheck.core.messages import OutMsg, TokenMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request


class Oracle(Invariant):
    """Every token equals the sequential reference's (the model run on the request alone)."""

    id = "oracle"
    # A routine token (`RequestLedger.routine`) is one the ledger found equal to the reference's
    # (it compares exact ones inline): only the others, a few a request, come here.
    judges_routine = False

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if not isinstance(msg, TokenMsg) or req is None or req.late or req.expected is None:
            return
        k = len(req.tokens) - 1  # the ledger appended this token already
        expected = req.expected.tokens
        if k >= len(expected) and expected:
            self.fail(
                f"token #{k + 1} = {msg.token}, the reference ends after {len(expected)}",
                (msg.uid,),
            )
        if not req.expected.matches(k, msg.token):
            self.fail(
                f"token #{k + 1} = {msg.token}, the reference says "
                f"{expected[k] if k < len(expected) else 'nothing'}",
                (msg.uid,),
                position=k,
                got=msg.token,
                expected=expected[k] if k < len(expected) else None,
            )
