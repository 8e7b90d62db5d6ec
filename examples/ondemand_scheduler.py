"""A vLLM-v1-style overlap scheduler: KV pages on demand, preemption by recompute, mixed batches.

Written against `core/` only, independent of `reference/`. Each iteration builds one batch under
the token budget (`max_extend_tokens`): every running request gets its next tokens (one for a
decode, a chunk for a prompt or a recompute), then waiting requests are admitted while slots,
pages and budget last. A batch that holds both prompt chunks and decodes is a `mixed` batch.
Pages are allocated when a sequence needs them. When none is free, the last-admitted running
request is preempted (vLLM's `running.pop()`): its slot and pages go back, it is queued at the
front, and when admitted again it is re-prefilled from prompt + the tokens it already sent.
Nothing is resent.

The disciplines (a `Discipline` each; the factories below build them):

* `keep` (vLLM): a preempted request's in-flight result is processed like any other; its token is
  sent, and the recompute starts after it. The request is admitted again only once that result is
  in.
* `discard` (SGLang's `if req.is_retracted: continue`): that result is dropped and the position is
  sampled again after the recompute. Nothing was sent for it, so nothing is sent twice.
* `stream-ordered` (vLLM's single stream): every H2D (tokens, page table, metadata) is issued on
  the engine stream, in order with the forwards, and a finished or preempted request's slot and
  pages go back at once, before the host waited for the round still in flight. The next user's
  copies queue behind that round on the same stream, so the reuse is ordered.

Otherwise (the first two) copies go on the scheduler stream, and a slot and its pages go back only
once no launched batch holds the request, as `core/protocol.py`'s release rule says.

Illegal neighbours, each one spot, for the checker's tests: `resend` (discard, but the dropped
result is sent as well: a token twice), `unordered-reuse` (stream-ordered release with the copies
on the scheduler stream: the reuse races with the round in flight), `over-decode` (a recompute
that decodes one round past `max_tokens`), `cascade` (discard, and preemption that does not count
the pages an in-flight round still pins: it preempts everyone, itself included, every result is
dropped, and nobody gains a token: `progress`).

    overlapcheck explore --scheduler examples/ondemand_scheduler.py:make_scheduler
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, NamedTuple

from overlapcheck.core.batch import BatchInput, Phase, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device, Event, ForwardOutput, Stream
from overlapcheck.core.messages import RejectMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import Books, Holding, MessageSink, MessageSource, wait_for_arrival
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.trace import PAGE_TABLE, TOKEN_POOL

Bug = Literal["resend", "unordered-reuse", "over-decode", "cascade"]


@dataclass(frozen=True, slots=True)
class Discipline:
    keep_inflight: bool = True  # keep a preempted request's in-flight result (vLLM), or drop it
    copies_on_engine: bool = False  # every H2D on the engine stream, in order with the forwards
    release_at_once: bool = False  # slot and pages back before the in-flight round is processed
    bug: Bug | None = None


class Status(Enum):
    WAITING = "waiting"  # new, never admitted
    RUNNING = "running"
    PREEMPTED = "preempted"  # queued again; re-prefilled from prompt + sent when admitted
    DONE = "done"  # finished or aborted; resources may wait for an in-flight batch


@dataclass(eq=False)
class Req:
    """`total`: positions the row holds once every launched forward ran (prompt, then one per
    sampled output); `computed`: positions whose KV a launched forward computes."""

    msg: UserMsg
    max_output: int
    status: Status = Status.WAITING
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    total: int = 0
    computed: int = 0
    inflight: int = 0  # launched batches holding it, not processed yet
    epoch: int = 0  # preemptions so far: a result launched in an older epoch is stale
    released: bool = True  # holds no slot and no pages

    @property
    def uid(self) -> int:
        return self.msg.uid

    @property
    def prompt_len(self) -> int:
        return len(self.msg.input_ids)

    @property
    def sampled(self) -> int:
        """Output positions launched (sent or in flight)."""
        return self.total - self.prompt_len


class Seq(NamedTuple):
    req: Req
    epoch: int
    samples: bool  # the forward samples an output position for it (its last chunk)


class Launched(NamedTuple):
    batch: BatchInput
    seqs: tuple[Seq, ...]
    output: ForwardOutput
    copy_done: Event


class OnDemandScheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        device: Device,
        source: MessageSource,
        sink: MessageSink,
        discipline: Discipline = Discipline(),
    ) -> None:
        self.config, self.device, self.source, self.sink = config, device, source, sink
        self.rule = discipline
        self.free_slots = list(range(config.num_slots))  # a heap: the lowest slot first
        self.free_pages = list(range(config.num_pages))
        self.waiting: list[Req] = []  # preempted requests first, then new ones in arrival order
        self.running: list[Req] = []  # admission order: the last is preempted first
        self.held: list[Req] = []  # every request holding anything or still waiting
        self.live: dict[int, Req] = {}
        self.inflight: Launched | None = None
        self.staged: Event | None = None
        self.batch_id = 0
        self.preemptions = 0
        self.dropped = 0  # in-flight results of preempted requests dropped (discard)

    # -- the protocol -------------------------------------------------------------------------

    def step(self) -> bool:
        dev = self.device
        idle = not (self.waiting or self.running or self.inflight)
        if idle and not wait_for_arrival(dev, self.source):
            return False
        for msg in self.source.poll(dev.now()):
            if isinstance(msg, UserMsg):
                self._add(msg)
            else:
                self._abort(msg.uid)
        launched = self._schedule_and_launch()
        if self.config.loop == "normal":
            if launched is not None:
                self._process(launched)
        else:
            if self.inflight is not None:
                self._process(self.inflight)
            self.inflight = launched
        return True

    def books(self) -> Books:
        live = tuple(
            Holding(
                r.uid,
                None if r.released else r.slot,
                tuple(r.pages),
                r.status is Status.DONE,
                r.status is Status.PREEMPTED,
            )
            for r in self.held
        )
        return Books(
            live=live,
            free_slots=tuple(sorted(self.free_slots)),
            free_pages=tuple(self.free_pages),
            pending=tuple(r.uid for r in self.waiting),
        )

    # -- messages -----------------------------------------------------------------------------

    def _add(self, msg: UserMsg) -> None:
        reason = rejection(self.config, msg, live=msg.uid in self.live)
        if reason is not None:
            self.sink(RejectMsg(msg.uid, reason))
            return
        req = Req(msg, max_output(self.config, msg), total=len(msg.input_ids))
        self.live[msg.uid] = req
        self.held.append(req)
        self.waiting.append(req)

    def _abort(self, uid: int) -> None:
        req = self.live.pop(uid, None)
        if req is None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.status = Status.DONE
        self._release(req)

    # -- resources ----------------------------------------------------------------------------

    def _release(self, req: Req) -> None:
        """Give back the slot and pages once no launched batch uses them (or at once: then the
        next user's copies must queue behind that batch on the engine stream)."""
        if not req.released and (req.inflight == 0 or self.rule.release_at_once):
            req.released = True
            heapq.heappush(self.free_slots, req.slot)
            self.free_pages += req.pages
            req.pages = []
        if req.released and req.status is Status.DONE and req.inflight == 0 and req in self.held:
            self.held.remove(req)

    def _preempt(self, victim: Req) -> None:
        self.preemptions += 1
        self.running.remove(victim)
        victim.status = Status.PREEMPTED
        victim.epoch += 1
        if not self.rule.keep_inflight:  # the in-flight sample is dropped: sample it again
            victim.total = victim.prompt_len + len(victim.sent)
        victim.computed = 0
        self.waiting.insert(0, victim)
        self._release(victim)

    def _grow(self, req: Req, end: int) -> bool:
        """Pages for positions [0, end), allocated on demand. While short, the last running
        request is preempted (`req` itself when it is the last). False when `req` was preempted,
        or must wait for pages that come back once the in-flight round is processed."""
        need = self.config.pages_for(end) - len(req.pages)
        while need > len(self.free_pages):
            if need <= len(self.free_pages) + self._coming_back() and self.rule.bug != "cascade":
                return False
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        req.pages += self.free_pages[:need]
        del self.free_pages[:need]
        return True

    def _coming_back(self) -> int:
        """Pages of preempted or finished requests that a launched batch still holds."""
        return sum(len(r.pages) for r in self.held if r.status is not Status.RUNNING)

    def _cells(self, req: Req, start: int, end: int) -> tuple[int, ...]:
        ps = self.config.page_size
        return tuple(req.pages[i // ps] * ps + i % ps for i in range(start, end))

    # -- schedule and launch ------------------------------------------------------------------

    def _schedule_and_launch(self) -> Launched | None:
        dev = self.device
        with dev.span("schedule", work=len(self.held)):
            built = self._schedule()
        if built is None:
            return None
        batch, seqs = built
        with dev.span("launch", work=len(seqs)):
            if not self.rule.copies_on_engine:
                dev.wait_stream(dev.engine_stream, dev.scheduler_stream)
            output = dev.forward(batch, dev.engine_stream)
            return Launched(batch, seqs, output, dev.record(dev.engine_stream))

    def _schedule(self) -> tuple[BatchInput, tuple[Seq, ...]] | None:
        budget = self.config.max_extend_tokens
        chosen: list[tuple[Req, int, int]] = []
        preempted = False
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not Status.RUNNING or req.sampled >= self._limit(req):
                continue  # preempted by one ahead of it, or every output position launched
            end = min(req.total, req.computed + budget)
            before = self.preemptions
            if not self._grow(req, end):
                preempted = True
                continue
            preempted |= self.preemptions != before
            chosen.append((req, req.computed, end))
            budget -= end - req.computed
        chosen = [c for c in chosen if c[0].status is Status.RUNNING]  # victims chosen earlier
        while not preempted and budget and self.waiting and self.free_slots:
            req = self.waiting[0]
            if not req.released or req.inflight:
                break  # its last round is still out: its token (or its pages) not back yet
            end = min(req.total, budget)
            if self.config.pages_for(end) > len(self.free_pages):
                break
            self.waiting.pop(0)
            self._admit(req)
            self._grow(req, end)
            chosen.append((req, 0, end))
            budget -= end
        if not chosen:
            return None
        return self._prepare(chosen)

    def _limit(self, req: Req) -> int:
        return req.max_output + (1 if self.rule.bug == "over-decode" and req.epoch else 0)

    def _admit(self, req: Req) -> None:
        req.status = Status.RUNNING
        req.slot = heapq.heappop(self.free_slots)
        req.released = False
        req.computed = 0
        self.running.append(req)

    def _prepare(self, chosen: list[tuple[Req, int, int]]) -> tuple[BatchInput, tuple[Seq, ...]]:
        dev = self.device
        stream: Stream = dev.engine_stream if self.rule.copies_on_engine else dev.scheduler_stream
        tables: list[RowWrite] = []
        tokens: list[RowWrite] = []
        works: list[SeqWork] = []
        seqs: list[Seq] = []
        for req, start, end in chosen:
            tables.append(RowWrite(req.slot, start, self._cells(req, start, end)))
            if start == 0:  # admitted now: the prompt and every token already sent
                known = (*req.msg.input_ids, *req.sent)[: req.total]
                tokens.append(RowWrite(req.slot, 0, known))
            samples = end == req.total
            out_row, out_col = (req.slot, end) if samples else (self.config.dummy_row, 0)
            cells = self._cells(req, 0, end)
            works.append(SeqWork(req.uid, req.slot, start, end, out_row, out_col, cells))
            seqs.append(Seq(req, req.epoch, samples))
            req.computed = end
            req.inflight += 1
            if samples:
                req.total += 1
        dev.copy_to_device(PAGE_TABLE, tables, stream)
        if tokens:
            dev.copy_to_device(TOKEN_POOL, tokens, stream)
        self.batch_id += 1
        steps = sum(1 for w in works if w.end - w.start == 1 and w.start > 0)  # decode-shaped
        phase: Phase = "mixed" if steps else "prefill"
        if steps == len(works) or all(w.end - w.start == 1 for w in works):
            phase = "decode"
        batch = BatchInput(self.batch_id, phase, tuple(works))
        if self.staged is not None:  # one pinned staging buffer: its last copy must have run
            self.staged.synchronize()
        self.staged = dev.stage_metadata(batch, stream)
        return batch, tuple(seqs)

    # -- process results ----------------------------------------------------------------------

    def _process(self, launched: Launched) -> None:
        with self.device.span("process", work=len(launched.seqs)):
            launched.copy_done.synchronize()
            tokens = launched.output.tokens()
            for (req, epoch, samples), token in zip(launched.seqs, tokens, strict=True):
                req.inflight -= 1
                stale = epoch != req.epoch and not self.rule.keep_inflight
                if samples and req.status is not Status.DONE:
                    if stale and self.rule.bug != "resend":
                        self.dropped += 1  # SGLang: the retracted request's result is dropped
                    elif len(req.sent) < req.max_output:
                        self._send(req, token)
                if req.status is not Status.RUNNING:
                    self._release(req)

    def _send(self, req: Req, token: int) -> None:
        req.sent.append(token)
        eos = token == self.config.eos_token_id and not req.msg.sampling_params.ignore_eos
        finished = eos or len(req.sent) == req.max_output
        self.sink(TokenMsg(req.uid, token, finished))
        if finished:
            self.live.pop(req.uid, None)
            if req in self.running:
                self.running.remove(req)
            if req in self.waiting:
                self.waiting.remove(req)
            req.status = Status.DONE
            self._release(req)


def _factory(discipline: Discipline) -> type[OnDemandScheduler]:
    class Variant(OnDemandScheduler):
        def __init__(
            self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
        ) -> None:
            super().__init__(config, device, source, sink, discipline)

    return Variant


make_scheduler = _factory(Discipline())  # vLLM: keep the in-flight result
make_discard_scheduler = _factory(Discipline(keep_inflight=False))  # SGLang: drop, sample again
STREAM_ORDERED = Discipline(copies_on_engine=True, release_at_once=True)
make_stream_ordered_scheduler = _factory(STREAM_ORDERED)
make_stream_ordered_discard_scheduler = _factory(
    Discipline(keep_inflight=False, copies_on_engine=True, release_at_once=True)
)
# Illegal neighbours: each must be caught.
make_resend_scheduler = _factory(Discipline(keep_inflight=False, bug="resend"))
make_unordered_reuse_scheduler = _factory(Discipline(release_at_once=True, bug="unordered-reuse"))
make_over_decode_scheduler = _factory(Discipline(bug="over-decode"))
make_cascade_scheduler = _factory(Discipline(keep_inflight=False, bug="cascade"))
