"""An overlap scheduler that behaves as mini-sglang's did before its fixes (e7d4f65 to 20fcd7f).

Written for overlapcheck from mini-sglang's design (a request's `device_len` advances when a round
is launched; `_process_last_data` handles batch N after batch N+1 is launched), not from its code,
and independent of `reference/`. Four spots, each marked `UPSTREAM BUG`, behave as upstream did;
`make_fixed_scheduler` builds the same scheduler with the four spots fixed:

1. `finished = not req.can_decode`: `can_decode` counts rounds launched, and under overlap the last
   round is launched before the one ahead of it is processed, so token max_tokens-1 is marked
   finished (then the last one again).
2. Every result is replied, so a request finished one round earlier (at EOS, or by 1) gets a stale
   token message for the round that was already launched when it finished.
3. A request's slot and pages go back to the free lists as soon as it finishes (or is aborted),
   while the in-flight batch still reads and writes its `token_pool`/`page_table` row and KV pages.
4. An abort while the request's prefill is in flight releases it at once, and processing the
   prefill's result handles it again: its token is sent after the abort, and if that token ends
   it, its slot and pages are released a second time.

The cache is naive (no prefix sharing): caching a request means giving its pages back. Prompts
longer than `max_extend_tokens` are prefilled in chunks; a non-final chunk's sample goes to the
dummy row and its result is skipped. `books()` exposes the free lists and holdings, so the
white-box checks (`pages-conserved`, the books halves of `slot-not-in-flight` and `liveness`) run.

    overlapcheck explore --scheduler examples/upstream_overlap.py:make_scheduler
    overlapcheck explore --scheduler examples/upstream_overlap.py:make_fixed_scheduler
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

from overlapcheck.core.batch import BatchInput, Phase, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device, Event, ForwardOutput
from overlapcheck.core.messages import AbortMsg, OutMsg, RejectMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import Books, Holding, MessageSink, MessageSource
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.trace import PAGE_TABLE, TOKEN_POOL


@dataclass(eq=False)
class Req:
    """A request from arrival to release. `cached_len`: prompt positions a launched prefill
    computes; `device_len`: prompt plus the samples of every launched round."""

    uid: int
    input_ids: tuple[int, ...]
    output_len: int
    ignore_eos: bool
    table_idx: int = -1  # the slot; -1 while pending
    pages: list[int] = field(default_factory=list)
    cells: list[int] = field(default_factory=list)  # host copy of page_table[table_idx, :]
    cached_len: int = 0
    device_len: int = 0
    outputs: list[int] = field(default_factory=list)
    ongoing: int = 0  # launched batches holding it whose results are not processed yet
    done: bool = False  # finished or aborted
    release_due: bool = False  # done, resources kept until `ongoing` drops to 0 (fixed only)

    def __post_init__(self) -> None:
        self.device_len = len(self.input_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def max_device_len(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def prefilled(self) -> bool:
        return self.cached_len >= self.prompt_len

    @property
    def can_decode(self) -> bool:
        """Another round may be launched: counts rounds *launched*, not results received."""
        return self.prefilled and self.device_len < self.max_device_len

    def complete_one(self) -> None:
        """A round (the final prefill chunk or a decode step) was launched."""
        self.cached_len = self.device_len
        self.device_len += 1


class ForwardData(NamedTuple):
    batch: BatchInput
    reqs: tuple[Req, ...]
    output: ForwardOutput
    copy_done: Event


class UpstreamOverlapScheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        device: Device,
        source: MessageSource,
        sink: MessageSink,
        fixed: bool = False,
    ) -> None:
        self.config = config
        self.device = device
        self.source = source
        self.sink = sink
        self.fixed = fixed
        self.free_slots = list(range(config.num_slots))  # a heap: the lowest slot first
        self.free_pages = list(range(config.num_pages))
        self.pending: list[Req] = []  # not admitted yet, arrival order
        self.prefilling: list[Req] = []  # admitted, prompt not fully launched
        self.running: dict[Req, None] = {}  # prefilled and decoding (an ordered set)
        self.held: dict[Req, None] = {}  # every request the scheduler keeps anything for
        self.finished_reqs: set[Req] = set()  # finished while processing the last batch
        self.last_data: ForwardData | None = None
        self.staged: Event | None = None
        self.batch_id = 0

    # -- the protocol -------------------------------------------------------------------------

    def step(self) -> bool:
        if not self._receive():
            return False
        ongoing = self._schedule_and_launch()
        if self.config.loop == "overlap":
            self._process_last_data(self.last_data)
            self.last_data = ongoing
        else:
            self._process_last_data(ongoing)
        return True

    def books(self) -> Books:
        live = tuple(
            Holding(r.uid, None if r.table_idx < 0 else r.table_idx, tuple(r.pages), r.done)
            for r in self.held
        )
        return Books(
            live=live,
            free_slots=tuple(sorted(self.free_slots)),
            free_pages=tuple(self.free_pages),
            pending=tuple(r.uid for r in self.pending),
        )

    # -- messages -----------------------------------------------------------------------------

    def _receive(self) -> bool:
        busy = self.last_data is not None or self.pending or self.prefilling or self.running
        if not busy:
            arrival = self.source.next_arrival()
            if arrival is None:
                return False
            if arrival > self.device.now():
                self.device.sleep_until(arrival)
        for msg in self.source.poll(self.device.now()):
            if isinstance(msg, UserMsg):
                self._add_req(msg)
            else:
                self._abort_req(msg)
        return True

    def _live(self, uid: int) -> Req | None:
        return next((r for r in self.held if r.uid == uid and not r.done), None)

    def _add_req(self, msg: UserMsg) -> None:
        reason = rejection(self.config, msg, live=self._live(msg.uid) is not None)
        if reason is not None:
            self._send(RejectMsg(msg.uid, reason))
            return
        p = msg.sampling_params
        req = Req(msg.uid, msg.input_ids, max_output(self.config, msg), p.ignore_eos)
        self.pending.append(req)
        self.held[req] = None

    def _abort_req(self, msg: AbortMsg) -> None:
        req = self._live(msg.uid)
        if req is None:
            return  # unknown, or finished already
        req.done = True
        if req in self.pending:
            self.pending.remove(req)
            del self.held[req]
            return
        if req in self.prefilling:
            self.prefilling.remove(req)
        self.running.pop(req, None)
        self._free_req_resources(req)  # UPSTREAM BUG 4 (with 3): at once, prefill in flight

    # -- schedule and launch ------------------------------------------------------------------

    def _schedule_and_launch(self) -> ForwardData | None:
        dev = self.device
        with dev.span("schedule", work=len(self.held)):
            phase: Phase = "prefill"
            chunks = self._schedule_prefill()
            if not chunks:
                phase = "decode"
                chunks = [(r, r.device_len - 1, r.device_len) for r in self.running if r.can_decode]
            if not chunks:
                return None
            batch = self._prepare(phase, chunks)
        with dev.span("launch", work=len(chunks)):
            dev.wait_stream(dev.engine_stream, dev.scheduler_stream)
            output = dev.forward(batch, dev.engine_stream)
            copy_done = dev.record(dev.engine_stream)
        reqs = tuple(req for req, _, _ in chunks)
        for req in reqs:
            req.ongoing += 1
        # as upstream's `filter_reqs`: the running set keeps whoever may launch another round
        merged = [*self.running, *(r for r in reqs if not r.done)]
        self.running = {r: None for r in merged if r.can_decode}
        return ForwardData(batch, reqs, output, copy_done)

    def _schedule_prefill(self) -> list[tuple[Req, int, int]]:
        """Chunks under the token budget: requests part-way through their prompt first, then
        admissions (a free slot and every page the request may need, arrival order)."""
        budget = self.config.max_extend_tokens
        chunks: list[tuple[Req, int, int]] = []
        for req in self.prefilling:
            if budget > 0:
                size = min(budget, req.prompt_len - req.cached_len)
                chunks.append((req, req.cached_len, req.cached_len + size))
                budget -= size
        while budget > 0 and self.pending and self.free_slots:
            req = self.pending[0]
            need = self.config.pages_for(req.max_device_len)
            if need > len(self.free_pages):
                break
            self.pending.pop(0)
            req.table_idx = heapq.heappop(self.free_slots)
            req.pages, self.free_pages = self.free_pages[:need], self.free_pages[need:]
            ps = self.config.page_size
            req.cells = [p * ps + i for p in req.pages for i in range(ps)][: req.max_device_len]
            self.prefilling.append(req)
            size = min(budget, req.prompt_len)
            chunks.append((req, 0, size))
            budget -= size
        return chunks

    def _prepare(self, phase: Phase, chunks: list[tuple[Req, int, int]]) -> BatchInput:
        dev = self.device
        tables: list[RowWrite] = []
        tokens: list[RowWrite] = []
        seqs: list[SeqWork] = []
        for req, start, end in chunks:
            slot = req.table_idx
            if start == 0 and phase == "prefill":  # admitted now: its whole page table row
                tables.append(RowWrite(slot, 0, tuple(req.cells)))
            if phase == "prefill":
                tokens.append(RowWrite(slot, start, req.input_ids[start:end]))
            final = end >= req.prompt_len
            out_row, out_col = (slot, end) if final else (self.config.dummy_row, 0)
            seqs.append(SeqWork(req.uid, slot, start, end, out_row, out_col, req.cells[:end]))
            if final:
                if phase == "prefill":
                    self.prefilling.remove(req)
                req.complete_one()
            else:
                req.cached_len = end
        if tables:
            dev.copy_to_device(PAGE_TABLE, tables, dev.scheduler_stream)
        if tokens:
            dev.copy_to_device(TOKEN_POOL, tokens, dev.scheduler_stream)
        self.batch_id += 1
        batch = BatchInput(self.batch_id, phase, tuple(seqs))
        if self.staged is not None:  # one pinned staging buffer: its last copy must have run
            self.staged.synchronize()
        self.staged = dev.stage_metadata(batch, dev.scheduler_stream)
        return batch

    # -- process results ----------------------------------------------------------------------

    def _process_last_data(self, last_data: ForwardData | None) -> None:
        if last_data is None:
            return
        batch, reqs, output, copy_done = last_data
        new_finished: set[Req] = set()
        with self.device.span("process", work=len(reqs)):
            copy_done.synchronize()
            for req, seq, token in zip(reqs, batch.seqs, output.tokens(), strict=True):
                req.ongoing -= 1
                if seq.end < req.prompt_len:
                    pass  # a non-final chunk: nothing to report
                elif self.fixed and req.done:
                    pass  # FIXED 2 and 4: the extra round of a finished or aborted request
                else:
                    self._handle_result(req, token, batch.phase, new_finished)
                if req.release_due and req.ongoing == 0:
                    self._release(req)
        self.finished_reqs = new_finished

    def _handle_result(self, req: Req, token: int, phase: Phase, new_finished: set[Req]) -> None:
        req.outputs.append(token)
        # UPSTREAM BUG 1: `can_decode` counts the rounds launched, one ahead under overlap.
        # FIXED 1: the results received decide.
        finished = len(req.outputs) >= req.output_len if self.fixed else not req.can_decode
        if not req.ignore_eos:
            finished |= token == self.config.eos_token_id
        # UPSTREAM BUG 2 (unless fixed): sent even for a request finished one round earlier
        self._send(TokenMsg(req.uid, token, finished))
        if finished and req not in self.finished_reqs:
            # upstream skips only the second free of a request finished in the last batch; an
            # aborted request is not in that set (UPSTREAM BUG 4: released once more)
            req.done = True
            self.running.pop(req, None)
            self._free_req_resources(req)
            new_finished.add(req)
        elif phase == "prefill":
            self._cache_req(req, finished=False)

    def _free_req_resources(self, req: Req) -> None:
        if self.fixed and req.ongoing > 0:
            # FIXED 3 and 4: the in-flight batch still uses the row and pages; release them once
            # it is processed
            req.release_due = True
            return
        self._release(req)  # UPSTREAM BUG 3: at once, whatever is in flight

    def _release(self, req: Req) -> None:
        req.release_due = False
        heapq.heappush(self.free_slots, req.table_idx)
        self._cache_req(req, finished=True)
        self.held.pop(req, None)

    def _cache_req(self, req: Req, *, finished: bool) -> None:
        """The naive cache keeps no prefixes: a finished request's pages go back to the free
        list; a prefilled one keeps them."""
        if finished:
            self.free_pages += req.pages

    def _send(self, msg: OutMsg) -> None:
        self.sink(msg)


def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> UpstreamOverlapScheduler:
    """As upstream behaved before the fixes."""
    return UpstreamOverlapScheduler(config, device, source, sink, fixed=False)


def make_fixed_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> UpstreamOverlapScheduler:
    """The same scheduler with the four spots fixed."""
    return UpstreamOverlapScheduler(config, device, source, sink, fixed=True)
