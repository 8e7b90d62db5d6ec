"""`work-bound`: no request gets more GPU work or KV pages than its admission allowed.

Judged from the forwards' uids and footprints, per request instance (`invariants/forwards.py`):

* positions sampled: a forward over a context of `end` positions samples output position
  `end - len(prompt)` (0 for the prompt's last chunk). A request has `max_tokens` of them (clamped
  to its row, `core.rules.max_output`): a forward whose context reaches past the last one does
  work no output can need. The bound is on positions, not on forwards: a request preempted and
  re-prefilled from prompt + the tokens it was sent runs several forwards that reach the same
  positions (its non-final recompute chunks, and a position sampled again after its in-flight
  result was legally dropped); what it was sent is judged by the message checks and the oracle.
  The overlap loop launches a round before it learns the previous token, so after an EOS one more
  round runs, still within `max_tokens`. None may sample after the request's finished message
  went out: then the host knew.
* pages: the KV pages of the context a forward reads for it (the host's page-table row) never
  number more than admission reserved, `config.pages_for(len(prompt) + max_output)`.
* drafts: where a forward says which of a sequence's last positions are drafts being verified
  (`Op.drafts`), both bounds are on its input's end, not on its drafts: a scheduler may verify a
  full set of drafts by design (vLLM does), and what it sends is judged elsewhere. An input past
  `max_tokens` is excused only right after a forward of the same request that verified drafts,
  and by fewer positions than it verified: an overlapped scheduler launches the next step before
  it learns how many were accepted. After
  a forward without drafts the host knew how far its in-flight step gets.
"""

from __future__ import annotations

from operator import lt

import numpy as np

from overlapcheck.core.messages import InMsg
from overlapcheck.core.trace import KV, Op
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request
from overlapcheck.invariants.forwards import ForwardFeed


class WorkBound(Invariant):
    """No forward samples an output position past `max_tokens`, none after the finished message, no
    context over the pages its prompt and output need."""

    id = "work-bound"
    batched = True  # False: every sequence judged one by one (the same verdicts, for comparison)

    def __init__(self) -> None:
        self.feed = ForwardFeed()
        self.limits: dict[int, tuple[int, int]] = {}  # request index -> prompt, pages reserved
        # The last forward's requests when none had finished, the ledger's finishes then, and
        # per sequence the context length from which `_judge` would judge anything: a forward
        # of the same requests, none finished since and each below it, has nothing to judge.
        self.batch: tuple[Request | None, ...] = ()
        self.finishes = 0
        self.quiet: list[int] = []
        self.drafted: dict[int, int] = {}  # request index -> drafts its last forward verified

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        self._check()

    def on_ops(self) -> None:
        if self.feed.seen != len(self.run.trace.ops):  # only new ops need judging
            self._check()

    def on_step_end(self) -> None:
        self.on_ops()

    def finish(self) -> None:
        self._check()

    def _check(self) -> None:
        for op, reqs in self.feed.pull(self.run):
            self._judge(op, reqs)

    def _judge(self, op: Op, reqs: tuple[Request | None, ...]) -> None:
        cfg = self.run.config
        ends = self.run.shapes.lists(op)[1]
        if len(ends) != len(reqs):
            return
        finishes = self.run.ledger.finishes
        drafts = None if op.drafts is None else op.drafts.tolist()
        before = self._drafted(reqs, drafts)
        # (requests compare by identity)
        if reqs == self.batch and finishes == self.finishes and all(map(lt, ends, self.quiet)):
            return  # the last forward's requests, none finished since, each below its bound
        self.batch = ()
        context: np.ndarray | None = None
        for i, (req, end) in enumerate(zip(reqs, ends, strict=True)):
            if req is None:
                continue
            limits = self.limits.get(req.index)
            if limits is None:
                prompt = len(req.msg.input_ids)
                limits = self.limits[req.index] = (prompt, cfg.pages_for(prompt + req.max_output))
            prompt, reserved = limits
            unknown = 0
            if drafts is not None:
                end -= drafts[i]  # the input's end: the drafts after it are verified
                unknown = before[i] if before else 0
                if unknown:  # pages for the positions an unknown acceptance may reach too
                    reserved = cfg.pages_for(prompt + req.max_output + unknown)
            # (`_sampled`'s two findings, asked here: a call per sequence costs more)
            if end >= prompt and (
                end - prompt >= req.max_output
                or (req.finish_ops is not None and op.seq >= req.finish_ops)
            ):
                self._sampled(op, req, end - prompt, unknown)
            if end > reserved:  # fewer positions than reserved pages can never be too many pages
                if context is None:
                    context = next(a.cells for a in op.accesses if a.buffer == KV and a.mode == "r")
                start = sum(ends[:i])  # where the sequence's context starts in the read
                pages = np.unique(context[start : start + end] // cfg.page_size)
                if len(pages) > reserved:
                    self.fail(
                        f"{op.label} (step {op.step}) gives request {req.uid} a context over "
                        f"{len(pages)} KV pages; admission reserved {reserved} (prompt "
                        f"{prompt} + max output {req.max_output}, page size {cfg.page_size})",
                        (req.uid,),
                        pages=len(pages),
                        reserved=reserved,
                    )
        self._quiet(reqs, finishes)

    def _drafted(
        self, reqs: tuple[Request | None, ...], drafts: list[int] | None
    ) -> list[int] | None:
        """For a forward that says its drafts: the drafts each sequence's request verified in
        its previous forward (0: none, or none known); then this forward's are booked."""
        if drafts is None:
            return None
        if len(drafts) != len(reqs):
            return None
        before = []
        for req, count in zip(reqs, drafts, strict=True):
            if req is None:
                before.append(0)
                continue
            before.append(self.drafted.get(req.index, 0))
            self.drafted[req.index] = count
        return before

    def _quiet(self, reqs: tuple[Request | None, ...], finishes: int) -> None:
        """Keep the batch for the next forward when none of its requests has finished: a
        sequence is judged only from a context that reaches its output's end, or that has more
        positions than its request has reserved pages (only then can it span more pages)."""
        if not self.batched:
            return
        quiet = []
        for req in reqs:
            if req is None or req.finish_ops is not None:
                return
            prompt, reserved = self.limits[req.index]
            quiet.append(min(prompt + req.max_output, reserved + 1))
        self.batch, self.finishes, self.quiet = reqs, finishes, quiet

    def _sampled(self, op: Op, req: Request, position: int, unknown: int = 0) -> None:
        """`unknown`: the drafts the request's previous forward verified: a scheduler that
        launched this one before reading that one could not know how many were accepted, so
        its input may be past `max_tokens` by fewer than that many positions."""
        finished = req.finish_ops  # the ledger's, booked as the message went out
        if finished is not None and op.seq >= finished:
            self.fail(
                f"{op.label} (step {op.step}) samples output position {position} of request "
                f"{req.uid} after its finished message went out",
                (req.uid,),
                position=position,
            )
        if position >= req.max_output + unknown:
            self.fail(
                f"{op.label} (step {op.step}) samples request {req.uid}'s output position "
                f"{position + 1}: max_tokens {req.max_output} needs only {req.max_output}",
                (req.uid,),
                position=position,
            )
