"""Speculative decode steps of the reference scheduler (`draft_tokens` > 0).

Each decode step is a verify step (`core/speculative.py`): the host drafts up to k tokens per
request by prompt lookup, the device keeps what the model agrees with plus one token. In the
overlap loop the host launches step N+1 before it has processed step N, so it does not know how
many tokens N emitted: N+1 then covers every start N can leave (a shift of up to N's drafts) and
carries a placeholder that the device resolves from N's result. The host drafts N+1 as if N
accepted all of its drafts (a wrong guess costs acceptance, never correctness).

A request's step is launched only when even the longest run its in-flight step can emit leaves
its own tokens inside `max_tokens`; otherwise it waits one iteration for that result. So every
step has an output to give, and no step reaches past the pages admission reserved.

Every fix of a known upstream bug of speculation under overlap sits at a spot guarded by a named
fault (see `reference/faults.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from overlapcheck.core.batch import BatchInput, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device, Event, ForwardOutput
from overlapcheck.core.speculative import Drafter, DraftQuery, has_placeholders
from overlapcheck.core.trace import DRAFT_POOL, PAGE_TABLE
from overlapcheck.reference import faults as F
from overlapcheck.reference.cache.manager import CacheManager
from overlapcheck.reference.decode import DecodeManager
from overlapcheck.reference.drafter import PromptLookup
from overlapcheck.reference.preemption import Preemption
from overlapcheck.reference.req import Req


class Host(Protocol):
    """What the speculative steps use of the scheduler that runs them (reference/scheduler.py)."""

    config: SchedulerConfig
    device: Device
    cache: CacheManager
    decode: DecodeManager
    preemption: Preemption
    _next_batch_id: int

    def _stage(self, batch: BatchInput) -> None: ...

    def _append(self, req: Req, token: int) -> None: ...

    def _maybe_release(self, req: Req, early: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class Round:
    """A request's latest verify step: where it ran and what it guessed."""

    batch_id: int
    index: int  # the request's sequence index in that batch
    drafts: tuple[int, ...]


@dataclass(slots=True)
class SpecState:
    last: Round | None = None
    unresolved: int = 0  # verify steps launched whose results are not processed
    processed_start: int = -1  # where the latest processed step really started
    preempted: bool = False  # preempted: reset once its launched steps are drained


@dataclass(slots=True)
class SpecStats:
    steps: int = 0  # verify sequences launched
    drafted: int = 0
    emitted: int = 0  # tokens their results gave (before any cut)
    waits: int = 0  # times a request sat out an iteration for its in-flight result


class SpecDecoder:
    def __init__(self, scheduler: Host) -> None:
        self.s = scheduler
        self.k = scheduler.config.draft_tokens
        self.states: dict[Req, SpecState] = {}
        self.drafter: Drafter = PromptLookup()
        self.reads_done: Event | None = None  # after the latest forward that read draft_pool
        self.stats = SpecStats()
        # A victim's in-flight verify step computes KV as far as its end: a swap copies all of it.
        scheduler.preemption.kv_end = lambda req: max(req.kv_len, req.table_len)
        scheduler.preemption.on_preempt = self.preempted

    def state(self, req: Req) -> SpecState:
        st = self.states.get(req)
        if st is None or (st.preempted and st.unresolved == 0):
            # NOTE: a preempted request's books start afresh only after its launched steps
            # were drained against them (their placeholders were reserved there).
            st = self.states[req] = SpecState()
        return st

    def preempted(self, req: Req) -> None:
        """`req` was preempted: its steps in flight still come back (kept or dropped)."""
        if self._fault(F.PREEMPT_PLACEHOLDER_RESET):
            self.states[req] = SpecState()  # upstream: rolled back now, drained later
        else:
            self.state(req).preempted = True

    def _fault(self, name: str) -> bool:
        return name in self.s.config.faults

    # -- schedule ------------------------------------------------------------------------------

    def schedule(self) -> tuple[BatchInput | None, tuple[Req, ...]]:
        """The decode batch: a verify sequence per request that can take a step now."""
        s = self.s
        for gone in [r for r in self.states if r.released]:
            del self.states[gone]
        batch_id = s._next_batch_id  # taken only if a batch is built: placeholders name B - 1
        seqs: list[SeqWork] = []
        reqs: list[Req] = []
        rounds: list[Round] = []
        table_writes: list[RowWrite] = []
        draft_writes: list[RowWrite] = []
        plans: dict[Req, tuple[int, int, int, tuple[int, ...]]] = {}
        for req in s.decode.batch():
            planned = self._plan(req, batch_id)
            if planned is None:
                self.stats.waits += 1
                continue
            plans[req] = planned
        # Pages on demand: who gets the pages of a step without drafts (preempting to make room,
        # as for a decode: drafts are worth no preemption), then drafts cut to what is left.
        ends = {r: p[0] + p[1] + 1 for r, p in plans.items()}
        chosen = s.preemption.decode_batch(list(plans), ends)
        if s.preemption.on_demand:
            self._fit_drafts(chosen, plans, ends)
        for req in chosen:
            planned = plans[req]
            start, shift, source, drafts = planned
            end = start + shift + len(drafts) + 1
            s.cache.grow(req, end)
            if req.table_len < end:
                table_writes.append(
                    RowWrite(req.slot, req.table_len, tuple(req.cells[req.table_len : end]))
                )
                req.table_len = end
            if drafts:
                draft_writes.append(RowWrite(req.slot, 0, drafts))
            seqs.append(
                SeqWork(
                    req.uid,
                    req.slot,
                    start,
                    end,
                    req.slot,
                    start + 1,
                    req.cells[:end],
                    verify=True,
                    drafts=len(drafts),
                    shift=shift,
                    source=source,
                )
            )
            reqs.append(req)
            rounds.append(Round(batch_id, len(seqs) - 1, drafts))
        if not seqs:
            return None, ()
        s._next_batch_id += 1
        dev = s.device
        if table_writes:
            dev.copy_to_device(PAGE_TABLE, table_writes, dev.scheduler_stream)
        if draft_writes:
            # NOTE: one draft row per slot: the forward that reads the old drafts must have run
            # before the new ones are copied over them.
            if self.reads_done is not None:
                dev.wait_event(dev.scheduler_stream, self.reads_done)
            dev.copy_to_device(DRAFT_POOL, draft_writes, dev.scheduler_stream)
        batch = BatchInput(batch_id, "decode", tuple(seqs))
        s._stage(batch)
        for req, seq, rnd in zip(reqs, seqs, rounds, strict=True):
            st = self.state(req)
            st.last = rnd
            st.unresolved += 1
            req.inflight += 1
            req.device_len = max(req.device_len, seq.start + 2)  # each step emits one at least
            self.stats.steps += 1
            self.stats.drafted += seq.drafts
        return batch, tuple(reqs)

    def _fit_drafts(
        self,
        chosen: list[Req],
        plans: dict[Req, tuple[int, int, int, tuple[int, ...]]],
        ends: dict[Req, int],
    ) -> None:
        """Cut the drafts of the chosen steps, in order, to the pages left once every chosen
        step has the pages of its positions without drafts."""
        size = self.s.config.page_size
        held = {r: len(r.cells) // size for r in chosen}
        needs = {r: max(0, self.s.config.pages_for(ends[r]) - held[r]) for r in chosen}
        left = self.s.cache.available_pages - sum(needs.values())
        for req in chosen:
            start, shift, source, drafts = plans[req]
            room = (held[req] + needs[req] + max(left, 0)) * size - ends[req]  # cells past end
            keep = drafts[: max(0, room)]
            used = max(0, self.s.config.pages_for(ends[req] + len(keep)) - held[req])
            left -= used - needs[req]
            plans[req] = (start, shift, source, keep)

    def _plan(self, req: Req, batch_id: int) -> tuple[int, int, int, tuple[int, ...]] | None:
        """Start, shift, placeholder source and drafts of the request's next step (None: it
        waits for its in-flight result)."""
        st = self.state(req)
        known = [*req.prompt, *req.outputs]
        limit = req.prompt_len + req.max_output - 1  # the last position an output may take
        in_flight = st.unresolved > 0  # its latest verify step is unprocessed
        # upstream: the placeholders reserved for a step outlived its result
        stale = self._fault(F.STALE_PLACEHOLDER) and st.last is not None
        last = st.last
        if (in_flight or stale) and last is not None and last.drafts:
            # one past the start of the step in flight (known: the one before it was processed)
            start = len(known) if in_flight else st.processed_start + 1
            shift = len(last.drafts)
            room = limit - (start + shift + 1)  # drafts that leave the last output in bounds
            if room >= 0:
                source = self._source(req, batch_id, last)
                ask = DraftQuery(req.uid, batch_id, tuple(known), last.drafts, 1, min(self.k, room))
                return start, shift, source, self._draft(ask)
            if in_flight:
                return None  # the step in flight may end the request: wait for its result
        committed = len(known)
        if in_flight or req.inflight > 0:  # a step in flight that emits exactly one token
            committed += 1
        start = committed - 1
        room = limit - committed
        if room < 0:
            return None
        skip = committed - len(known)  # the in-flight step's one token
        ask = DraftQuery(req.uid, batch_id, tuple(known), (), skip, min(self.k, room))
        return start, 0, -1, self._draft(ask)

    def _draft(self, ask: DraftQuery) -> tuple[int, ...]:
        return tuple(self.drafter.draft(ask)[: ask.wanted])

    def _source(self, req: Req, batch_id: int, last: Round) -> int:
        """The request's sequence index in the previous batch, where its placeholder resolves."""
        if last.batch_id == batch_id - 1 or self._fault(F.STALE_PLACEHOLDER):
            return last.index
        raise AssertionError(f"request {req.uid}: in-flight step {last.batch_id} not the last")

    # -- launch --------------------------------------------------------------------------------

    def launch(self, batch: BatchInput) -> ForwardOutput:
        """Order the streams, resolve the placeholders, run the forward (engine stream)."""
        dev = self.s.device
        resolve = has_placeholders(batch)
        if resolve and self._fault(F.RESOLVE_UNORDERED):
            dev.resolve(batch, dev.engine_stream)  # upstream: before the metadata copy is waited
            resolve = False
        dev.wait_stream(dev.engine_stream, dev.scheduler_stream)
        if resolve:
            # NOTE: after the metadata copy (the wait above) and after the previous forward
            # (same stream), before this one.
            dev.resolve(batch, dev.engine_stream)
        drafts = any(s.drafts for s in batch.seqs)
        if drafts and self._fault(F.READS_DONE_EARLY):
            self.reads_done = dev.record(dev.engine_stream)  # upstream: before the forward reads
        output = dev.forward(batch, dev.engine_stream)
        if drafts and not self._fault(F.READS_DONE_EARLY):
            self.reads_done = dev.record(dev.engine_stream)
        return output

    # -- process -------------------------------------------------------------------------------

    def process(self, reqs: tuple[Req, ...], output: ForwardOutput, copy_done: Event) -> None:
        """A verify batch's results: each request's emitted tokens, cut where it finishes."""
        s = self.s
        with s.device.span("process", work=len(reqs)):
            copy_done.synchronize()
            emitted = output.emitted()
            for req, tokens in zip(reqs, emitted, strict=True):
                req.inflight -= 1
                self.state(req).unresolved -= 1
                self.stats.emitted += len(tokens)
                early = False
                if req.drop:
                    req.drop -= 1  # retracted while in flight: sampled again after recompute
                    if self._fault(F.RETRACT_SKIPS_INFLIGHT):
                        req.outputs += tokens  # upstream: kept for the context, never sent
                elif not req.done:  # else: aborted, or a step past its finish: dropped
                    self.state(req).processed_start = req.prompt_len + len(req.outputs) - 1
                    # committed, less the last token (its KV comes with the next step); never
                    # past the row the host has mapped (a fault's confused count stays a finding
                    # about tokens, not a crash of the cache)
                    committed = req.prompt_len + len(req.outputs) + len(tokens)
                    req.kv_len = min(committed - 1, req.table_len)
                    for token in tokens:  # max_tokens or EOS cuts the step where it falls
                        s._append(req, token)
                        if req.done:
                            # upstream freed the row at once, though the next step reads it
                            early = self._fault(F.FREE_ROW_IN_VERIFY)
                            break
                s._maybe_release(req, early=early)
                if req.released:
                    self.states.pop(req, None)

    def chunk_result(self, req: Req) -> None:
        """A non-final prefill chunk's result (it emits nothing)."""
        if self._fault(F.PLACEHOLDER_UNDERFLOW):
            self.state(req).unresolved -= 1  # upstream: as if it had consumed a placeholder
