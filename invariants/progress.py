"""`progress`: while work remains, a preemption is followed by progress within a bound.

A preemption is seen in the trace, for any scheduler: a forward that computes again positions it
computed before for the same request instance (a recompute after preemption by recompute), or a
KV offload to the host on the transfer stream (preemption by swap). Progress is a token message
for any request. From the first preemption after the last token, some request must gain a token
within `bound(config)` iterations: enough for every slot's request to re-prefill the longest row
in chunks of `max_extend_tokens`, one after the other, and for the overlap loop's round of lag.
A cascade of preemptions that frees nothing and lets nobody finish a step (each victim's work
thrown away before it yields a token) is then a finding at that bound, not a liveness timeout
hundreds of iterations later. Preemptions while nothing is live (all finished or aborted) do not
count.
"""

from __future__ import annotations

from operator import le
from typing import cast

import numpy as np

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import InMsg, OutMsg, TokenMsg
from overlapcheck.core.trace import TOKEN_POOL, Op
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request
from overlapcheck.invariants.forwards import ForwardFeed


def bound(config: SchedulerConfig) -> int:
    """Iterations from a preemption within which some request must gain a token."""
    chunks = -(-config.max_seq_len // config.max_extend_tokens)
    return config.num_slots * (chunks + 1) + 4


class Progress(Invariant):
    """A preemption is followed by a token for some request within a bound of iterations while
    work remains."""

    id = "progress"
    batched = True  # False: every sequence judged one by one (the same verdicts, for comparison)

    def __init__(self) -> None:
        self.feed = ForwardFeed()
        self.computed: dict[int, int] = {}  # request index -> positions computed so far
        self.since: int | None = None  # step of the first preemption since the last token
        self.preemptions = 0  # since the last token
        self.first: str = ""  # what the first of them was
        self.tokens = 0  # token messages sent by the last pull
        self.offloads = 0  # of the run's KV offloads (`ForwardIndex`), pulled
        # The last forward's requests (distinct, none None) and their ends, when each request's
        # `computed` is its end there: a forward of the same requests, each going on from that
        # end, only moves the ends (a decode batch's every step), booked when the batch changes.
        self.batch: tuple[Request, ...] = ()
        self.batch_ends: list[int] = []

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        self._pull()

    def on_ops(self) -> None:
        self._pull()

    def ops_at_message(self, msg: OutMsg, req: Request | None) -> None:
        # The ledger booked this message already; if it is a token, it follows the preemptions
        # pulled now, and the next pull sees it.
        self._pull(isinstance(msg, TokenMsg))

    def on_step_end(self) -> None:
        self._pull()
        if self.since is None:
            return
        if not self.run.ledger.live:
            self.since, self.preemptions = None, 0
            return
        limit = bound(self.run.config)
        if self.run.step - self.since >= limit:
            live = tuple(sorted(self.run.ledger.live))
            self.fail(
                f"{self.preemptions} preemptions since step {self.since} (the first: "
                f"{self.first}) and no request gained a token in {limit} iterations while "
                f"requests {list(live)} wait: a cascade that makes no progress",
                live,
                preemptions=self.preemptions,
                since=self.since,
            )

    def _pull(self, booked_token: bool = False) -> None:
        """Progress, then preemptions: a token message since the last pull followed every
        preemption seen by then (each op issued before a message is pulled by the time it goes
        out: at the message, `ops_at_message`, or before). `booked_token`: the message being
        sent is a token, counted by the ledger already, not yet sent as far as this pull goes."""
        tokens = self.run.ledger.token_messages - booked_token
        if tokens != self.tokens:
            self.tokens = tokens
            self.since, self.preemptions = None, 0
        ops, index = self.run.trace.ops, self.run.forwards
        if self.feed.seen == len(ops):
            return  # nothing issued since the last pull
        pulled = self.feed.pull(self.run)
        offloads = index.offloads[self.offloads :]  # issued since the last pull, as the forwards
        self.offloads = len(index.offloads)
        for op, reqs in pulled:
            self._forward(op, reqs)
        for op in offloads:
            self._preempted(f"{op.label} swaps out request {op.uids[0]}")

    def _forward(self, op: Op, reqs: tuple[Request | None, ...]) -> None:
        ends = self.run.shapes.lists(op)[1]
        if len(ends) != len(reqs):
            return
        starts = _starts(op, ends, self.run.config.max_seq_len)
        # (requests compare by identity)
        if reqs == self.batch and starts == self.batch_ends and all(map(le, starts, ends)):
            # The last forward's requests again, each from where it stopped: none recomputes,
            # and each has computed through its end (`_settle` books it when the batch changes).
            self.batch_ends = ends
            return
        self._settle()
        computed = self.computed
        settled = None not in reqs and len(set(reqs)) == len(reqs)
        for req, start, end in zip(reqs, starts, ends, strict=True):
            if req is None:
                continue
            done = computed.get(req.index, 0)
            if start < done:
                self._preempted(f"{op.label} recomputes request {req.uid} from position {start}")
                computed[req.index] = end
            elif end > done:
                computed[req.index] = end
            elif done != end:
                settled = False
        if settled and self.batched:  # each request's computed positions end here
            self.batch, self.batch_ends = cast(tuple[Request, ...], reqs), ends

    def _settle(self) -> None:
        """Book the positions the batch's requests computed since its last full look."""
        batch = self.batch
        if batch:
            computed = self.computed
            for req, end in zip(batch, self.batch_ends, strict=True):
                computed[req.index] = end
            self.batch = ()

    def _preempted(self, what: str) -> None:
        if self.since is None:
            self.since, self.first = self.run.step, what
        self.preemptions += 1


def _starts(op: Op, ends: list[int], width: int) -> list[int]:
    """Each sequence's first new position, from the forward's token-pool read (its input ids,
    sequence by sequence, one row each)."""
    read = None
    for access in op.accesses:  # (a loop, not `next` over a generator: once per forward)
        if access.buffer == TOKEN_POOL and access.mode == "r":
            read = access.cells
            break
    if read is None or len(read) == len(ends):  # one new token each: the last position
        return [end - 1 for end in ends]
    rows = read // width
    begins = np.flatnonzero(np.diff(rows, prepend=-1) != 0)
    if len(begins) != len(ends):
        return [end - 1 for end in ends]
    starts: list[int] = (read[begins] % width).tolist()
    return starts
