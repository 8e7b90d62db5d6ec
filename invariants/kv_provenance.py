"""`kv-provenance`: every KV cell a forward reads holds what a forward computed for exactly that
token, at that position, of that request's context.

The device keeps a shadow per KV cell (`backends/kv_shadow.py`: the position and a hash of the
context through it, and the forward that wrote it) and records, per forward, what each context
position held when the kernel read it and what it sampled. This check keeps each request's own
context (its prompt, then the tokens its forwards sampled) and compares, position by position. A
wrong prefix-cache match, a stale page-table row or a page reused too early then fails at the
forward that reads the wrong cell, not later through the tokens. Sharing a prefix that another
request computed is right: the cell's key is the hash of the same tokens. Only real request
instances are judged (a padding sequence with no request behind it, such as a dummy row, is not).

The simulator keeps the shadow; a device without one (the real engine) skips the check with a
notice. The footprints say which cells the host meant; the shadow says what the kernel really read.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from overlapcheck.backends.kv_shadow import ForwardReads, KvShadow, PrefixHash
from overlapcheck.core.messages import InMsg, UserMsg
from overlapcheck.core.trace import Op
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request, RunContext
from overlapcheck.invariants.forwards import Attributed, ForwardFeed


class _Context:
    """A request's own context as far as it is known: tokens and the key through each position."""

    def __init__(self, req: Request, hashing: PrefixHash) -> None:
        width = hashing.width
        prompt = np.asarray(req.msg.input_ids[:width], dtype=np.int64)
        self.prompt_len = len(req.msg.input_ids)
        self.tokens = np.full(width + 1, -1, dtype=np.int64)
        self.keys = np.zeros(width + 1, dtype=np.uint64)
        self.tokens[: len(prompt)] = prompt
        self.keys[: len(prompt)] = hashing.keys(prompt)
        self.known = len(prompt)

    def sampled(self, position: int, token: int) -> None:
        """A forward of the request sampled `token` for `position` (kept if it is the next one)."""
        if position != self.known or position >= len(self.tokens) or position < self.prompt_len:
            return
        prev = int(self.keys[position - 1]) if position else 0
        self.tokens[position] = token
        self.keys[position] = PrefixHash.extend(prev, token)
        self.known += 1


class KvProvenance(Invariant):
    id = "kv-provenance"
    deferrable = False  # reads the device's shadow as the run goes
    needs_kv_shadow = True

    def __init__(self) -> None:
        self.feed = ForwardFeed()
        self.pending: deque[Attributed] = deque()
        self.contexts: dict[int, _Context] = {}  # request index -> its context
        self.shadow: KvShadow | None = None

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        if run.kv_shadow is None:
            run.notices.append(
                f"skipped kv-provenance: the {run.backend_name} backend keeps no KV shadow (what "
                "each KV cell was computed for); only the simulator records it"
            )
            return
        self.shadow = run.kv_shadow

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        if self.shadow is None:
            return
        self.pending.extend(self.feed.pull(self.run.trace))
        if isinstance(msg, UserMsg):
            self.feed.admit(req)

    def on_ops(self) -> None:
        # A message may be the first sign of a forward that ran: judge its reads before the
        # message checks judge its tokens.
        shadow = self.shadow
        if shadow is None:
            return
        if self.feed.seen == len(self.run.trace.ops):
            # No new forward: only the oldest pending one can have become judgeable (it ran).
            if not self.pending:
                return
            rec = shadow.reads.get(self.pending[0][0].seq)
            if rec is None or rec.samples is None:
                return
        self._check()

    def on_step_end(self) -> None:
        if self.shadow is not None:
            self._check()

    def finish(self) -> None:
        if self.shadow is not None:
            self._check()

    def _check(self) -> None:
        assert self.shadow is not None
        self.pending.extend(self.feed.pull(self.run.trace))
        reads = self.shadow.reads
        while self.pending:
            op, reqs = self.pending[0]
            rec = reads.get(op.seq)
            if rec is None or rec.samples is None:
                return  # not run yet: forwards are judged in issue order
            self.pending.popleft()
            del reads[op.seq]
            self._judge(op, reqs, rec)

    def _context(self, req: Request) -> _Context:
        ctx = self.contexts.get(req.index)
        if ctx is None:
            assert self.shadow is not None
            ctx = self.contexts[req.index] = _Context(req, self.shadow.hash)
        return ctx

    def _judge(self, op: Op, reqs: tuple[Request | None, ...], rec: ForwardReads) -> None:
        n, m = rec.keys.shape
        if len(reqs) != n:
            return  # the device read another batch shape than issued: no-race reports that
        # A verify forward's drafts and padding are not the request's tokens (yet): only its
        # committed positions are judged.
        judged = rec.ends if rec.judged is None else rec.judged
        ends = judged.tolist()
        expected = rec.keys.copy()  # rows of sequences with no request are not judged
        contexts: list[_Context | None] = []
        for i, req in enumerate(reqs):
            ctx = None if req is None else self._context(req)
            contexts.append(ctx)
            if ctx is not None:
                e = ends[i]
                if e > ctx.known:
                    self._report(op, rec, req, ctx, i, ctx.known)  # type: ignore[arg-type]
                expected[i, :e] = ctx.keys[:e]
        bad = expected != rec.keys
        if bad.any():
            bad &= np.arange(m) < judged[:, None]
            if bad.any():
                i, p = (int(x) for x in np.argwhere(bad)[0])
                ctx = contexts[i]
                assert ctx is not None
                self._report(op, rec, reqs[i], ctx, i, p)  # type: ignore[arg-type]
        assert rec.samples is not None
        if rec.emitted is not None:
            for ctx, end, tokens in zip(contexts, ends, rec.emitted, strict=True):
                for t, token in enumerate(tokens if ctx is not None else ()):
                    ctx.sampled(end + t, token)  # type: ignore[union-attr]
            return
        for ctx, end, token in zip(contexts, ends, rec.samples, strict=True):
            if ctx is not None:
                ctx.sampled(end, token)

    def _report(
        self, op: Op, rec: ForwardReads, req: Request, ctx: _Context, i: int, p: int
    ) -> None:
        cell, token = int(rec.cells[i, p]), rec.token(i, p)
        writer, held_pos = rec.held(i, p)
        where = f"{op.label} (step {op.step}) reads position {p} of request {req.uid}"
        if p >= ctx.known:
            why = "no forward of this request has sampled that position yet"
        elif p >= int(rec.starts[i]):
            why = (
                f"the input id it gathers from token_pool is {token}, the request's token there is "
                f"{int(ctx.tokens[p])}"
                if token != ctx.tokens[p]
                else "its prefix as read differs from the request's (an earlier position is wrong)"
            )
        elif writer < 0:
            why = f"KV cell {cell} was never computed by any forward"
        else:
            by = self.run.trace.ops[writer]
            who = f"{by.label} (step {by.step}, requests {list(by.uids)})"
            if held_pos != p:
                why = f"KV cell {cell} holds what {who} computed for position {held_pos}"
            elif token != ctx.tokens[p]:
                why = (
                    f"KV cell {cell} holds token {token}, computed by {who}; the request's token "
                    f"there is {int(ctx.tokens[p])}"
                )
            else:
                why = (
                    f"KV cell {cell} holds token {token} at position {p}, but computed by {who} "
                    "under another prefix than the request's"
                )
        self.fail(f"{where}: {why}", (req.uid,), cell=cell, position=p, forward=op.seq)
