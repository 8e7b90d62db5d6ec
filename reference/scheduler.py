"""The scheduler: one implementation, an overlap loop and a normal loop.

Overlap loop, one iteration: receive -> schedule batch N+1 and prepare its inputs on the scheduler
stream -> the engine stream waits for the scheduler stream -> launch forward N+1 -> process batch N
(wait for its copy-done event, append tokens, decide finished, free, reply). The normal loop does
the same with "process" right after "launch".

Every fix of a known upstream bug sits at a spot guarded by `self._fault(NAME)` (two for the faults
whose upstream behaviour also changed what a later result does), so that one named fault re-enables
it, message stream included (see `reference/faults.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from overlapcheck.core.batch import BatchInput, Phase, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device, Event, ForwardOutput
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.messages import AbortMsg, OutMsg, RejectMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import Books, DerivedBooks, Holding, MessageSource
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.speculative import Drafter, is_verify
from overlapcheck.core.trace import PAGE_TABLE, TOKEN_POOL
from overlapcheck.reference import faults as F
from overlapcheck.reference.cache.manager import CacheManager
from overlapcheck.reference.decode import DecodeManager
from overlapcheck.reference.managers import Managers
from overlapcheck.reference.preemption import Preemption
from overlapcheck.reference.prefill import Chunk, PrefillManager
from overlapcheck.reference.req import DONE_STATES, Req, ReqState
from overlapcheck.reference.speculative import SpecDecoder
from overlapcheck.reference.table import TableManager


class Launched(NamedTuple):
    """A batch whose forward was issued and whose results are not processed yet."""

    batch: BatchInput
    reqs: tuple[Req, ...]
    output: ForwardOutput
    copy_done: Event


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        device: Device,
        source: MessageSource,
        sink: Callable[[OutMsg], None] | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.source = source
        self.sink = sink
        self.table = TableManager(config.num_slots)
        self.cache = CacheManager(config)
        self.prefill = PrefillManager(config, self.cache, self.table)
        self.decode = DecodeManager()
        # Every request holding anything, pending to released, in arrival order; and by uid the
        # one not yet finished or aborted (a uid may come back while its old request waits for
        # its in-flight batch before it is released).
        self.held: list[Req] = []
        self.live: dict[int, Req] = {}
        managers = Managers(config, device, self.cache, self.table, self.decode)
        self.preemption = Preemption(managers, self.prefill.requeue, self.held)
        self.step_no = 0
        self.inflight: Launched | None = None
        self._staged: Event | None = None
        self._next_batch_id = 1
        # Speculative decode steps (draft_tokens > 0): reference/speculative.py.
        self.spec = SpecDecoder(self) if config.draft_tokens else None
        self._extend = False  # the last iteration's batch extends (`decisions()`)

    # -- public accessors (invariants read these) ---------------------------------------------

    @property
    def has_work(self) -> bool:
        return (
            self.prefill.has_work
            or bool(self.decode.running)
            or self.inflight is not None
            or bool(self.preemption.swapped)
        )

    @property
    def preemptions(self) -> int:
        """Requests preempted so far (for measurements)."""
        return self.preemption.count

    def books(self) -> Books:
        """The resource books (the protocol's optional capability), after checking the prefix
        tree's own structure.

        Raises InvariantError where the tree contradicts itself (a lock count gone negative).
        Pages and slots are not counted here: `pages-conserved` and `slot-not-in-flight` judge
        them from these books, so counting them twice per iteration bought nothing. The free
        list and each request's pages are immutable views that share storage with the books
        before (`cache/snapshots.py`), and each says which snapshot it was made from
        (`DerivedBooks`).
        """
        cached, locked = self.cache.prefix.books_pages()
        # Taken at every iteration: `tuple.__new__` is what `Holding._make` and `Books._make`
        # do, without a Python frame each; `DONE_STATES` is `Req.done`'s, without its call.
        make, done = tuple.__new__, DONE_STATES
        held = []
        held_from: list[Sequence[int] | None] = []
        for r in self.held:
            # The same snapshot while the pages stay (compared by identity), and a longer view
            # of its storage while the request only grows (`cache/snapshots.py`): no copy.
            pages, made_from = r.books_pages.after_appends(r.own_pages)
            held_from.append(made_from)
            slot = None if r.slot < 0 else r.slot  # a preempted request may still hold its slot
            held.append(make(Holding, (r.uid, slot, pages, r.state in done, r.preempted)))
        holdings = tuple(held)
        pending = [r.uid for r in self.prefill.pending]
        swapped = self.preemption.swapped
        if swapped:
            pending += [r.uid for r in swapped]
        free_slots = tuple(self.table.free_slots())
        allocator = self.cache.allocator
        free_pages = allocator.free_snapshot()
        books = make(
            DerivedBooks, (holdings, free_slots, free_pages, cached, locked, tuple(pending))
        )
        books.free_from, books.held_from = allocator.snapshot_from, tuple(held_from)
        return books

    def use_drafter(self, drafter: Drafter) -> None:
        """Draft with `drafter` instead of prompt lookup (a replay's: `TakesDrafter`)."""
        if self.spec is not None:
            self.spec.drafter = drafter

    def check_integrity(self) -> None:
        """The scheduler's own books: pages conserved, slots owned once. Raises InvariantError."""
        admitted = [r for r in self.held if r.state is not ReqState.PENDING]
        self.cache.check_integrity(admitted)
        slots = [r.slot for r in admitted]
        free = self.table.free_slots()
        if len(set(slots)) != len(slots) or set(slots) & set(free):
            raise InvariantError("slot-not-in-flight", f"slots held {sorted(slots)}, free {free}")
        if len(slots) + len(free) != self.config.num_slots:
            raise InvariantError("slot-not-in-flight", f"slots held {sorted(slots)}, free {free}")

    # -- the loops ----------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration of the configured loop; False once idle with nothing more to come."""
        self.device.set_step(self.step_no)
        if not self._receive():
            return False
        if self.config.loop == "overlap":
            self.overlap_step()
        else:
            self.normal_step()
        self.step_no += 1
        return True

    def overlap_step(self) -> None:
        launched = self._schedule_and_launch()
        self._extend = self._is_extend(launched)
        if self.inflight is not None:
            self._process(self.inflight)
        self.inflight = launched

    def normal_step(self) -> None:
        launched = self._schedule_and_launch()
        self._extend = self._is_extend(launched)
        if launched is not None:
            self._process(launched)

    def decisions(self) -> Mapping[str, object]:
        """The last iteration's collective decisions (`core/ranks.py`), which every rank must
        make alike: whether its batch runs in extend mode, the flag that data-parallel attention
        ranks all-gather to choose their collectives (and SGLang's, whether to disable overlap
        for two consecutive prefill batches)."""
        return {"extend": self._extend}

    def _is_extend(self, launched: Launched | None) -> bool:
        """Whether the batch extends (prefill or mixed), judged as every rank sees it: the
        all-gathered flag. The fault judges this rank's own share of the batch instead, the
        sequences data-parallel attention gives it (every `num_ranks`-th, from its rank)."""
        if launched is None or launched.batch.phase == "decode":
            return False
        if self._fault(F.LOCAL_EXTEND_FLAG):
            return bool(launched.batch.seqs[self.config.rank :: self.config.num_ranks])
        return True

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Run until idle with no more arrivals (offline use); returns the iterations run."""
        start = self.step_no
        while self.step():
            if max_steps is not None and self.step_no - start >= max_steps:
                break
        return self.step_no - start

    # -- receive ------------------------------------------------------------------------------

    def _receive(self) -> bool:
        if not self.has_work:
            arrival = self.source.next_arrival()
            if arrival is None:
                return False
            if arrival > self.device.now():
                self.device.sleep_until(arrival)
        for msg in self.source.poll(self.device.now()):
            if isinstance(msg, UserMsg):
                self._add_request(msg)
            else:
                self._abort(msg)
        return True

    def _add_request(self, msg: UserMsg) -> None:
        reason = rejection(self.config, msg, live=msg.uid in self.live)
        if reason is not None:
            self._send(RejectMsg(msg.uid, reason))
            return
        req = Req(
            msg.uid,
            tuple(msg.input_ids),
            msg.sampling_params,
            max_output(self.config, msg),
            arrival_step=self.step_no,
        )
        self.held.append(req)
        self.live[req.uid] = req
        self.prefill.add(req)

    def _abort(self, msg: AbortMsg) -> None:
        req = self.live.get(msg.uid)
        if req is None:
            return  # unknown, or already finished: nothing to cancel
        was = req.state
        req.state = ReqState.ABORTED
        if req.preempted:
            req.preempted = False
            self.preemption.forget(req)
        del self.live[req.uid]
        self.prefill.remove(req)
        self.decode.remove(req)
        if was is ReqState.PENDING and req.slot < 0:  # (a preempted one may hold its slot)
            req.released = True
            self.held.remove(req)
            return
        if self._fault(F.ABORT_INFLIGHT_PREFILL) and self._final_prefill_in_flight(req, was):
            self.cache.release(req, forget=False)  # upstream: cached now, and again on the result
        self._maybe_release(req)

    @staticmethod
    def _final_prefill_in_flight(req: Req, was: ReqState) -> bool:
        """The request's last prefill batch (a one-batch prompt or its final chunk) is launched
        and unprocessed: it is running, nothing came back yet, and a batch holds it."""
        return was is ReqState.RUNNING and req.inflight > 0 and not req.outputs

    # -- schedule and launch ------------------------------------------------------------------

    def _schedule_and_launch(self) -> Launched | None:
        with self.device.span("schedule", work=len(self.held)):
            batch, reqs = self._schedule()
        if batch is None:
            return None
        with self.device.span("launch", work=len(reqs)):
            dev = self.device
            if self.spec is not None and is_verify(batch):
                output = self.spec.launch(batch)
            else:
                dev.wait_stream(dev.engine_stream, dev.scheduler_stream)
                output = dev.forward(batch, dev.engine_stream)
            # NOTE: copy-done must follow the forward and its D2H on the engine stream.
            done_on = (
                dev.scheduler_stream if self._fault(F.COPY_DONE_WRONG_STREAM) else dev.engine_stream
            )
            launched = Launched(batch, reqs, output, dev.record(done_on))
        return launched

    def _reserved_pages(self) -> int:
        return sum(
            self.prefill.pages_needed(r)
            for r in self.held
            if r.state in (ReqState.PREFILLING, ReqState.RUNNING)
        )

    def _schedule(self) -> tuple[BatchInput | None, tuple[Req, ...]]:
        # The policy measures waiting in passes: this iteration's number is the clock.
        self.preemption.swap_in(self._reserved_pages())
        chunks, _ = self.prefill.schedule(self._reserved_pages(), step=self.step_no)
        phase: Phase = "prefill"
        if not chunks and self.spec is not None:
            return self.spec.schedule()
        if not chunks:
            phase = "decode"
            running = self.preemption.decode_batch(self.decode.batch())
            chunks = [Chunk(r, r.device_len - 1, r.device_len) for r in running]
        if not chunks:
            return None, ()
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        seqs, table_writes, token_writes = [], [], []
        for req, start, end in chunks:
            self.cache.grow(req, end)
            if req.table_len < end:
                table_writes.append(
                    RowWrite(req.slot, req.table_len, tuple(req.cells[req.table_len : end]))
                )
                req.table_len = end
            if phase == "prefill":
                token_writes.append(RowWrite(req.slot, start, req.fill[start:end]))
            out_row, out_col = self._sample_cell(req, end)
            seqs.append(SeqWork(req.uid, req.slot, start, end, out_row, out_col, req.cells[:end]))
        dev = self.device
        if table_writes:
            dev.copy_to_device(PAGE_TABLE, table_writes, dev.scheduler_stream)
        if token_writes:
            dev.copy_to_device(TOKEN_POOL, token_writes, dev.scheduler_stream)
        batch = BatchInput(batch_id, phase, tuple(seqs))
        self._stage(batch)
        for req, _, end in chunks:
            self._mark_launched(req, end)
        return batch, tuple(c.req for c in chunks)

    def _stage(self, batch: BatchInput) -> None:
        # NOTE: one pinned staging buffer: its previous H2D must have read it before we rewrite it.
        if self._staged is not None and not self._fault(F.STAGING_BUFFER_REUSE):
            self._staged.synchronize()
        self._staged = self.device.stage_metadata(batch, self.device.scheduler_stream)

    def _sample_cell(self, req: Req, end: int) -> tuple[int, int]:
        """Where the forward writes the sample taken at position `end - 1`."""
        if end < req.fill_len and not self._fault(F.CHUNK_SAMPLE_OVERWRITE):
            return self.config.dummy_row, 0  # a non-final chunk's sample is thrown away
        return req.slot, end

    def _mark_launched(self, req: Req, end: int) -> None:
        req.kv_len = end
        req.inflight += 1
        if req.state is ReqState.PREFILLING and end == req.fill_len:
            req.state = ReqState.RUNNING
            req.device_len = end + 1
            self.prefill.remove(req)
            self.decode.add(req)
        elif req.state is ReqState.RUNNING:
            req.device_len = end + 1

    # -- process results ----------------------------------------------------------------------

    def _process(self, launched: Launched) -> None:
        if self.spec is not None and is_verify(launched.batch):
            self.spec.process(launched.reqs, launched.output, launched.copy_done)
            return
        with self.device.span("process", work=len(launched.reqs)):
            launched.copy_done.synchronize()
            tokens = launched.output.tokens()
            for req, seq, token in zip(launched.reqs, launched.batch.seqs, tokens, strict=True):
                req.inflight -= 1
                if seq.end < req.fill_len:
                    if self.spec is not None:
                        self.spec.chunk_result(req)  # a non-final chunk: nothing to report
                elif req.drop:
                    req.drop -= 1  # retracted while in flight: sampled again after recompute
                    if self._fault(F.RETRACT_SKIPS_INFLIGHT):
                        req.outputs.append(token)  # upstream: kept for the context, never sent
                elif req.state is ReqState.ABORTED:
                    if launched.batch.phase == "prefill" and self._fault(F.ABORT_INFLIGHT_PREFILL):
                        # upstream cached a prefilled request here (a second time, after the
                        # abort did), then replied with the prefill's token
                        self._maybe_release(req)
                        self._send(TokenMsg(req.uid, token, self._is_last(req, 1, token)))
                    # else: the extra round of an aborted request: dropped
                elif req.done and not self._owed_round(req):
                    if self._fault(F.REPLY_AFTER_FINISH):
                        # upstream replied like to any result: `finished` as if still running
                        stale = self._is_last(req, len(req.outputs) + 1, token)
                        self._send(TokenMsg(req.uid, token, stale))
                    # else: the extra round of a finished request: dropped
                else:
                    self._append(req, token)
                self._maybe_release(req)

    def _append(self, req: Req, token: int) -> None:
        req.outputs.append(token)
        finished = self._is_last(req, len(req.outputs), token)
        self._send(TokenMsg(req.uid, token, finished))
        if finished:
            if req.preempted:  # its kept in-flight result ended it
                req.preempted = False
                self.prefill.remove(req)
                self.preemption.forget(req)
            req.state = ReqState.FINISHED
            if self.live.get(req.uid) is req:
                del self.live[req.uid]
            self.decode.remove(req)

    def _is_last(self, req: Req, count: int, token: int) -> bool:
        """Whether `token`, the request's `count`-th output, ends it (length or EOS)."""
        if self._fault(F.FINISH_BY_CAN_DECODE):
            # upstream's `not req.can_decode`: counts the rounds launched, one ahead under overlap
            last = req.launched_outputs >= req.max_output
        else:
            last = count >= req.max_output
        return last or self._is_eos(req, token)

    def _is_eos(self, req: Req, token: int) -> bool:
        return token == self.config.eos_token_id and not req.params.ignore_eos

    def _owed_round(self, req: Req) -> bool:
        """A request judged finished by `finish-by-can-decode` a round early: upstream still
        processed that last round, so its token is delivered (marked finished once more)."""
        return (
            self._fault(F.FINISH_BY_CAN_DECODE)
            and req.state is ReqState.FINISHED
            and 0 < len(req.outputs) < req.max_output
            and not self._is_eos(req, req.outputs[-1])
        )

    def _maybe_release(self, req: Req, early: bool = False) -> None:
        # NOTE: a finished request may sit in the in-flight batch (its extra round): its slot and
        # pages are still read and written there, so they are freed only once that batch is done.
        if req.preempted:
            self.preemption.settle(req)
            return
        # `early`: a named fault frees it anyway.
        if not req.done or req.released:
            return
        if req.inflight > 0 and not (early or self._fault(F.FREE_SLOT_EARLY)):
            return
        req.released = True
        self.cache.release(req)
        if req.slot >= 0:  # (a preempted request gave it back already)
            self.table.free(req.slot)
            self.device.released("slot", (req.slot,))
        self.held.remove(req)

    # -- helpers ------------------------------------------------------------------------------

    def _fault(self, name: str) -> bool:
        return name in self.config.faults

    def _send(self, msg: OutMsg) -> None:
        if self.sink is not None:
            self.sink(msg)
