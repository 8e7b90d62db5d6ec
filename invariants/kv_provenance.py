"""`kv-provenance`: every KV cell a forward reads holds what a forward computed for exactly that
token, at that position, of that request's context.

The device keeps a shadow per KV cell (`core/kv_shadow.py`: the position and a hash of the
context through it, and the forward that wrote it) and records, per forward, what each context
position held when the kernel read it and what it sampled. This check keeps each request's own
context (its prompt, then the tokens its forwards sampled) and compares, position by position. A
wrong prefix-cache match, a stale page-table row or a page reused too early then fails at the
forward that reads the wrong cell, not later through the tokens. Sharing a prefix that another
request computed is right: the cell's key is the hash of the same tokens. Only real request
instances are judged (a padding sequence with no request behind it, such as a dummy row, is not).

Judging is incremental and exact. A request's trust is the prefix of its context that a forward
read right from the cells of its slot's page-table row, as of the shadow's epoch that the check
has followed the mutation log to. A forward can change those cells' contents only by a logged
write of one of them (every cell in a trust is flagged; such a write drops every trust), and which
cells a row names only by a logged page-table write into that row (the trust is cut back to where
the write starts). The new positions a forward computed join the trust once its own write is
followed, if no other write of the same forward hit the same cells. A forward whose sequences'
cached reads all lie within trusts compares only its new positions' input ids with the requests'
tokens (the same first wrong position, given a right prefix); any other forward compares every
position of the read that `KvShadow.as_read` rebuilds.

The simulator keeps the shadow; a device without one (the real engine) skips the check with a
notice. The footprints say which cells the host meant; the shadow says what the kernel really read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from overlapcheck.core.kv_shadow import ForwardReads, KvShadow, KvWrite, PrefixHash
from overlapcheck.core.messages import InMsg
from overlapcheck.core.trace import Op
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import Request, RunContext
from overlapcheck.invariants.forwards import Attributed, ForwardFeed

# A write of more cells than this is followed with numpy, and adds nothing to trusts.
_SMALL_WRITE = 64


@dataclass(slots=True)
class _Trust:
    """Cells `slot`'s page-table row names at positions below `length` hold the request's keys
    there, as far as the check has followed the shadow's log; void once `generation` is old."""

    slot: int
    length: int
    generation: int


class _Context:
    """A request's own context as far as it is known: tokens and the key through each position."""

    def __init__(self, req: Request, hashing: PrefixHash) -> None:
        self.hashing = hashing
        self.limit = hashing.width + 1
        self.prompt_len = len(req.msg.input_ids)
        self.tokens = [int(t) for t in req.msg.input_ids[: hashing.width]]
        self.known = len(self.tokens)
        self.keys = np.zeros(self.limit, dtype=np.uint64)
        self.hashed = 0  # keys[:hashed] are computed, the rest on demand
        self.trust: _Trust | None = None

    def keys_through(self, end: int) -> np.ndarray:
        """The keys of positions below `end` (at most `known`)."""
        if end > self.hashed:
            prev = int(self.keys[self.hashed - 1]) if self.hashed else 0
            self.keys[self.hashed : end] = self.hashing.keys_after(
                prev, self.tokens[self.hashed : end]
            )
            self.hashed = end
        return self.keys[:end]

    def sampled(self, position: int, token: int) -> None:
        """A forward of the request sampled `token` for `position` (kept if it is the next one)."""
        if position != self.known or position >= self.limit or position < self.prompt_len:
            return
        self.tokens.append(token)
        self.known += 1


class KvProvenance(Invariant):
    """Every KV cell a forward reads holds what a forward computed for exactly that token, position
    and context."""

    id = "kv-provenance"
    deferrable = False  # reads the device's shadow as the run goes
    needs_kv_shadow = True
    incremental = True  # False: every forward judged in full (the same verdicts, for comparison)

    def __init__(self) -> None:
        self.feed = ForwardFeed()
        self.pending: deque[Attributed] = deque()
        self.contexts: dict[int, _Context] = {}  # request index -> its context
        self.shadow: KvShadow | None = None
        self.followed = 0  # the shadow's log is followed through this epoch
        self.generation = 0  # of the trusts: a write of a flagged cell starts a new one
        self.flags = bytearray()  # per cell: in a trust (or was, since the last new generation)
        self.flagged = np.zeros(0, dtype=np.uint8)  # the same bytes, for numpy
        self.by_slot: dict[int, list[_Trust]] = {}
        # Per forward not yet followed past its write: (trust, start, end, first) of each
        # sequence whose new positions start..end join its trust (at written[first:]).
        self.joining: dict[int, list[tuple[_Trust, int, int, int]]] = {}
        # The last forward's requests and their contexts (a decode batch's are the same each time)
        self.batch: tuple[Request | None, ...] = ()
        self.batch_contexts: list[_Context | None] = []

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        if run.kv_shadow is None:
            run.notices.append(
                f"skipped kv-provenance: the {run.backend_name} backend keeps no KV shadow (what "
                "each KV cell was computed for); only the simulator records it"
            )
            self.active = False  # no hook is called: nothing to judge
            return
        self.shadow = run.kv_shadow
        self.flags = bytearray(len(run.kv_shadow.key))
        self.flagged = np.frombuffer(self.flags, dtype=np.uint8)

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        if self.shadow is None:
            return
        self.pending.extend(self.feed.pull(self.run))

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
        self.on_ops()  # (the same: new forwards, or the oldest pending one has run)

    def finish(self) -> None:
        if self.shadow is not None:
            self._check()

    def _check(self) -> None:
        assert self.shadow is not None
        self.pending.extend(self.feed.pull(self.run))
        reads = self.shadow.reads
        while self.pending:
            op, reqs = self.pending[0]
            rec = reads.get(op.seq)
            if rec is None or rec.samples is None:
                return  # not run yet: forwards are judged in issue order
            self.pending.popleft()
            try:
                self._judge(op, reqs, rec)
            finally:
                self.shadow.release(op.seq, self.followed)

    def _context(self, req: Request) -> _Context:
        ctx = self.contexts.get(req.index)
        if ctx is None:
            assert self.shadow is not None
            ctx = self.contexts[req.index] = _Context(req, self.shadow.hash)
        return ctx

    def _judge(self, op: Op, reqs: tuple[Request | None, ...], rec: ForwardReads) -> None:
        starts = rec.first
        if len(reqs) != len(starts):
            return  # the device read another batch shape than issued: no-race reports that
        # A verify forward's drafts and padding are not the request's tokens (yet): only its
        # committed positions are judged.
        ends = rec.last if rec.judged is None else rec.judged.tolist()
        if reqs == self.batch:  # (requests compare by identity)
            contexts = self.batch_contexts
        else:
            get, context = self.contexts.get, self._context
            contexts = [None if r is None else (get(r.index) or context(r)) for r in reqs]
            self.batch, self.batch_contexts = reqs, contexts
        # Only a read after everything followed so far can be judged against the trusts (a
        # forward read out of issue order is judged in full).
        current = rec.epoch >= self.followed
        if current and rec.epoch > self.followed:
            self._follow(rec.epoch)
        # Where every cached position read lies within a trust, the first wrong key is at the
        # first new position whose input id is not the request's token there. (A position no
        # forward sampled yet is reported first, wherever it is.) A trust then ends where the
        # new positions start, and takes them once this forward's write is followed.
        trusted = current and self.incremental
        trusted, wrong, joining = self._judge_new(op, rec, reqs, contexts, ends, trusted)
        if not trusted:
            self._judge_all(op, rec, reqs, contexts, ends)
            if current:
                self._trust(rec, contexts, ends)
        elif wrong is not None:
            i, p = wrong
            self._report(op, rec, reqs[i], contexts[i], i, p)  # type: ignore[arg-type]
        elif joining:
            self.joining[rec.op] = joining
        assert rec.samples is not None
        if rec.emitted is not None:
            for ctx, end, tokens in zip(contexts, ends, rec.emitted, strict=True):
                for t, token in enumerate(tokens if ctx is not None else ()):
                    ctx.sampled(end + t, token)  # type: ignore[union-attr]
            return
        for ctx, end, token in zip(contexts, ends, rec.samples, strict=True):
            # (`_Context.sampled`, inline: this runs once per sequence of every forward)
            if ctx is not None and end == ctx.known and ctx.prompt_len <= end < ctx.limit:
                ctx.tokens.append(token)
                ctx.known = end + 1

    def _judge_new(
        self,
        op: Op,
        rec: ForwardReads,
        reqs: tuple[Request | None, ...],
        contexts: list[_Context | None],
        ends: list[int],
        trusted: bool,
    ) -> tuple[bool, tuple[int, int] | None, list[tuple[_Trust, int, int, int]]]:
        """Whether every sequence's cached reads lie within its trust (each such trust cut back to
        where its new positions start), the first new position whose input id is wrong, and the
        sequences whose new positions join their trusts once this forward's write is followed."""
        generation = self.generation
        ids = rec.ids.tolist() if rec.one_each else None
        at = None if ids is not None else self._new_at(rec)
        wrong: tuple[int, int] | None = None
        joining: list[tuple[_Trust, int, int, int]] = []
        for i, (ctx, start, end, slot) in enumerate(
            zip(contexts, rec.first, ends, rec.slots, strict=True)
        ):
            if ctx is None:
                continue
            if end > ctx.known:
                self._report(op, rec, reqs[i], ctx, i, ctx.known)  # type: ignore[arg-type]
            if not trusted:
                continue
            trust = ctx.trust
            cached = start if start < end else end  # the judged positions read from cells
            if (
                trust is None
                or trust.generation != generation
                or trust.slot != slot
                or trust.length < cached
            ):
                trusted = False
                continue
            trust.length = cached
            if start >= end:
                continue
            if ids is not None:
                if wrong is None and ids[i] != ctx.tokens[start]:
                    wrong = i, start
                joining.append((trust, start, end, i))
                continue
            if wrong is None:
                read = rec.fresh[i, start:end]
                bad = np.flatnonzero(read != np.array(ctx.tokens[start:end]))
                if len(bad):
                    wrong = i, start + int(bad[0])
            if at[i] >= 0:  # type: ignore[index]
                joining.append((trust, start, end, at[i]))  # type: ignore[index]
        return trusted, wrong, joining

    @staticmethod
    def _new_at(rec: ForwardReads) -> list[int]:
        """Where each sequence's new positions begin among `written` (-1: fewer than judged)."""
        counts = np.maximum(rec.ends - rec.starts, 0)
        judged = rec.ends if rec.judged is None else rec.judged
        at = np.cumsum(counts) - counts
        return np.where(judged - rec.starts <= counts, at, -1).tolist()  # type: ignore[no-any-return]

    def _judge_all(
        self,
        op: Op,
        rec: ForwardReads,
        reqs: tuple[Request | None, ...],
        contexts: list[_Context | None],
        ends: list[int],
    ) -> None:
        assert self.shadow is not None
        keys, _ = self.shadow.as_read(rec)
        m = keys.shape[1]
        expected = keys.copy()  # rows of sequences with no request are not judged
        for i, ctx in enumerate(contexts):
            if ctx is not None:
                e = ends[i]
                expected[i, :e] = ctx.keys_through(e)
        bad = expected != keys
        if bad.any():
            bad &= np.arange(m) < np.array(ends)[:, None]
            if bad.any():
                i, p = (int(x) for x in np.argwhere(bad)[0])
                ctx = contexts[i]
                assert ctx is not None
                self._report(op, rec, reqs[i], ctx, i, p)  # type: ignore[arg-type]

    def _trust(self, rec: ForwardReads, contexts: list[_Context | None], ends: list[int]) -> None:
        """A read judged in full and right, as of `followed`: each request trusts its cached
        positions, and its new ones once this forward's write is followed."""
        joining: list[tuple[_Trust, int, int, int]] = []
        at = None if rec.one_each else self._new_at(rec)
        by_slot, generation = self.by_slot, self.generation
        for i, (ctx, start, end, slot) in enumerate(
            zip(contexts, rec.first, ends, rec.slots, strict=True)
        ):
            if ctx is None:
                continue
            length = start if start < end else end
            old = ctx.trust
            if old is not None and old.generation == generation:
                by_slot[old.slot].remove(old)
            trust = ctx.trust = _Trust(slot, length, generation)
            self.flagged[rec.cells[i, :length]] = 1
            by_slot.setdefault(slot, []).append(trust)
            first = i if at is None else at[i]
            if start < end and first >= 0:
                joining.append((trust, start, end, first))
        if joining:
            self.joining[rec.op] = joining

    def _follow(self, epoch: int) -> None:
        """Follow the shadow's log through `epoch`: writes and page-table writes since."""
        assert self.shadow is not None
        log, trimmed = self.shadow.log, self.shadow.trimmed
        for k in range(self.followed - trimmed, epoch - trimmed):
            mut = log[k]
            if type(mut) is KvWrite:
                self._follow_write(mut)
                continue
            trusts_of = self.by_slot.get
            for slot, start, values in mut.rows:  # type: ignore[union-attr]
                trusts = trusts_of(slot)
                if trusts and len(values):
                    for trust in trusts:
                        if trust.length > start:
                            trust.length = start
        self.followed = epoch

    def _follow_write(self, mut: KvWrite) -> None:
        joining = self.joining.pop(mut.op, None)
        if len(mut.cells) > _SMALL_WRITE:
            if np.count_nonzero(self.flagged[mut.cells]):
                self._distrust()
            return
        cells = mut.cells.tolist()
        flags = self.flags
        if any(map(flags.__getitem__, cells)):
            self._distrust()
            return
        if joining is None or len(set(cells)) != len(cells):
            return  # where a cell was written twice, the later write holds it
        for trust, start, end, first in joining:
            # (every trust `joining` names is of this generation: `_distrust` empties it)
            if trust.length == start:
                trust.length = end
                if end == start + 1:
                    flags[cells[first]] = 1
                else:
                    for cell in cells[first : first + end - start]:
                        flags[cell] = 1

    def _distrust(self) -> None:
        """A write of a cell some trust may hold: trust nothing."""
        self.generation += 1
        self.flagged[:] = 0
        self.by_slot.clear()
        self.joining.clear()

    def _report(
        self, op: Op, rec: ForwardReads, req: Request, ctx: _Context, i: int, p: int
    ) -> None:
        assert self.shadow is not None
        cell, token = int(rec.cells[i, p]), rec.token(i, p)
        writer, held_pos = self.shadow.held(rec, i, p)
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
