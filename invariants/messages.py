"""Invariants over the messages the scheduler sends, judged per request instance."""

from __future__ import annotations

from overlapcheck.core.messages import OutMsg, RejectMsg, TokenMsg
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request


class NoPostEos(Invariant):
    """No token message for a request after its output ended.

    The output ends at EOS (unless `ignore_eos`) or with its `max_tokens`-th token. A finished
    message there ends the request; any token after it is after the end. A finished message
    before either ends nothing the contract knows of: the flag came too early, which is
    `exact-length`'s finding, and tokens after it carry the rest of the output that flag cut
    short. They are after the end only past `max_tokens` or after an EOS among them. So one
    defect is one finding: a stale round after EOS is this one, a finish flag one token early
    is `exact-length` (and skipping that does not make it this one).
    """

    id = "no-post-eos"
    ended_only = True  # a token for a live request is before its end

    def __init__(self) -> None:
        self.rest: dict[int, tuple[int, bool]] = {}  # request index -> (tokens, ended at EOS)

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if not isinstance(msg, TokenMsg):
            return
        if req is None:
            self.fail(f"token {msg.token} sent for uid {msg.uid}, which never arrived", (msg.uid,))
            return
        if not req.late or req.finished_step is None:
            return
        eos = self.run.config.eos_token_id
        ignore_eos = req.msg.sampling_params.ignore_eos
        n, ended = self.rest.get(req.index, (len(req.tokens), False))
        at_eos = bool(req.tokens) and req.tokens[-1] == eos and not ignore_eos
        ended = ended or n >= req.max_output or at_eos
        if ended:
            self.fail(
                f"token {msg.token} sent after the finished message (step {req.finished_step}), "
                f"past the end of its output ({n} of {req.max_output} tokens"
                + (", the last EOS)" if n < req.max_output else ")"),
                (msg.uid,),
            )
            return
        self.rest[req.index] = (n + 1, msg.token == eos and not ignore_eos)


class ExactLength(Invariant):
    """A served request gets exactly `max_tokens` tokens with `finished` on the last, or stops
    earlier at EOS; a request the rules reject is rejected, and only such a request."""

    id = "exact-length"
    judges_routine = False  # a token before the last one, not EOS, cannot fail here

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if req is None:
            return
        if (
            type(msg) is TokenMsg
            and not msg.finished
            and len(req.tokens) < req.max_output
            and msg.token != self.run.config.eos_token_id
            and req.rejection is None
        ):
            return  # a token before the end, not EOS: nothing below can fail (most messages)
        if isinstance(msg, RejectMsg):
            if req.rejection is None:
                self.fail(f"rejected ({msg.reason}), but the request can be served", (msg.uid,))
            return
        if req.rejection is not None:
            self.fail(
                f"token sent for a request that must be rejected ({req.rejection})", (msg.uid,)
            )
        if req.finished_step is None and (req.aborted_step is not None or req.rejected):
            return  # aborted or rejected: abort-silent and the reject check judge it
        n = len(req.tokens)
        limit = req.max_output
        if n > limit:
            self.fail(f"token {n} sent, max_tokens allows {limit}", (msg.uid,))
        at_eos = (
            msg.token == self.run.config.eos_token_id and not req.msg.sampling_params.ignore_eos
        )
        if msg.finished and n < limit and not at_eos:
            self.fail(f"finished after {n} of {limit} tokens, not at EOS", (msg.uid,))
        if n == limit and not msg.finished:
            self.fail(f"token {n} of {limit} sent without `finished`", (msg.uid,))
        if at_eos and not msg.finished:
            self.fail(f"token {n} is EOS but not `finished`", (msg.uid,))

    def finish(self) -> None:
        owed = self.run.ledger.owed_rejections()
        if owed:
            uids = tuple(r.uid for r in owed)
            self.fail(f"never rejected though the rules reject them: uids {list(uids)}", uids)


class AbortSilent(Invariant):
    """After an abort is delivered, no more messages for that request; with books, its
    resources come back."""

    id = "abort-silent"
    ended_only = True  # a live request was not aborted

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if req is not None and req.aborted_step is not None and not req.rejected:
            self.fail(
                f"{type(msg).__name__} sent after the abort delivered at step {req.aborted_step}",
                (msg.uid,),
            )

    def finish(self) -> None:
        books = self.run.books()
        if books is None:
            return
        aborted = {r.uid for r in self.run.ledger.requests if r.aborted_step is not None}
        held = sorted(
            h.uid for h in books.live if h.uid in aborted and h.uid not in self.run.ledger.live
        )
        if held:
            self.fail(f"aborted requests {held} still hold resources at the end", tuple(held))
