"""The smallest correct scheduler for overlapcheck's protocol (`core/protocol.py`).

Overlap or normal loop (`config.loop`); each prompt in one prefill batch; a naive cache: no prefix
sharing, every page a request may need taken at admission. No `books()`, so the white-box checks
are skipped with a notice; all the others run on the trace and the messages.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

from overlapcheck.core.batch import BatchInput, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device, Event, ForwardOutput
from overlapcheck.core.messages import RejectMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import (
    MessageSink,
    MessageSource,
    SchedulerFactory,
    wait_for_arrival,
)
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.trace import PAGE_TABLE, TOKEN_POOL


@dataclass(eq=False)
class Req:
    msg: UserMsg
    max_output: int
    slot: int = -1
    pages: tuple[int, ...] = ()
    cells: tuple[int, ...] = ()  # the KV cell of each position: its page_table row
    launched: int = 0  # sampling rounds launched (the prefill is the first)
    received: int = 0  # tokens sent
    inflight: int = 0  # launched batches holding it, not processed yet
    done: bool = False  # finished or aborted


class Launched(NamedTuple):
    batch: BatchInput
    reqs: list[Req]
    output: ForwardOutput
    copy_done: Event


class MinimalScheduler:
    def __init__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> None:
        self.config, self.device, self.source, self.sink = config, device, source, sink
        self.free_slots = list(range(config.num_slots))  # a heap: lowest slot first
        self.free_pages = list(range(config.num_pages))
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.live: dict[int, Req] = {}  # uid -> its request, until finished or aborted
        self.inflight: Launched | None = None
        self.staged: Event | None = None
        self.batch_id = 0

    def step(self) -> bool:
        dev = self.device
        idle = not (self.waiting or self.running or self.inflight)
        if idle and not wait_for_arrival(dev, self.source):
            return False  # idle, and nothing more will come
        for msg in self.source.poll(dev.now()):
            if isinstance(msg, UserMsg):
                self._add(msg)
            else:
                self._abort(msg.uid)
        launched = self._launch()
        if self.config.loop == "normal" and launched is not None:
            self._process(launched)
        elif self.config.loop == "overlap":  # process batch N while batch N+1 runs
            if self.inflight is not None:
                self._process(self.inflight)
            self.inflight = launched
        return True

    def _add(self, msg: UserMsg) -> None:
        reason = rejection(self.config, msg, live=msg.uid in self.live)
        if reason is not None:
            self.sink(RejectMsg(msg.uid, reason))
        else:
            self.live[msg.uid] = req = Req(msg, max_output(self.config, msg))
            self.waiting.append(req)

    def _abort(self, uid: int) -> None:
        req = self.live.pop(uid, None)
        if req is not None:  # else unknown, or finished already
            req.done = True
            (self.waiting if req in self.waiting else self.running).remove(req)
            self._release(req)

    def _release(self, req: Req) -> None:
        # NOTE: an in-flight batch may still read and write this request's row and KV pages,
        # so they go back to the free lists only once every batch holding it is processed.
        if req.done and req.inflight == 0 and req.slot >= 0:
            heapq.heappush(self.free_slots, req.slot)
            self.free_pages += req.pages

    def _launch(self) -> Launched | None:
        cfg, dev, ps = self.config, self.device, self.config.page_size
        reqs: list[Req] = []
        with dev.span("schedule", work=len(self.live)):
            while self.waiting and self.free_slots:  # admit: a free slot and every page it needs
                req, prompt = self.waiting[0], self.waiting[0].msg.input_ids
                length = len(prompt) + req.max_output
                need = cfg.pages_for(length)
                if need > len(self.free_pages):
                    break
                self.running.append(self.waiting.pop(0))
                req.slot = heapq.heappop(self.free_slots)
                req.pages, self.free_pages = tuple(self.free_pages[:need]), self.free_pages[need:]
                req.cells = tuple(p * ps + i for p in req.pages for i in range(ps))[:length]
                for buffer, row in ((PAGE_TABLE, req.cells), (TOKEN_POOL, prompt)):
                    dev.copy_to_device(buffer, [RowWrite(req.slot, 0, row)], dev.scheduler_stream)
                reqs.append(req)
            prefill = bool(reqs)
            reqs = reqs or [r for r in self.running if r.launched < r.max_output]
            if not reqs:
                return None
            seqs = []
            for r in reqs:  # the sample of position end - 1 goes to token_pool[slot, end]
                end = len(r.msg.input_ids) + r.launched
                start = 0 if prefill else end - 1
                seqs.append(SeqWork(r.msg.uid, r.slot, start, end, r.slot, end, r.cells[:end]))
                r.launched, r.inflight = r.launched + 1, r.inflight + 1
            self.batch_id += 1
            batch = BatchInput(self.batch_id, "prefill" if prefill else "decode", tuple(seqs))
            if self.staged is not None:  # NOTE: one staging buffer: its last copy must have run
                self.staged.synchronize()
            self.staged = dev.stage_metadata(batch, dev.scheduler_stream)
        with dev.span("launch", work=len(reqs)):
            dev.wait_stream(dev.engine_stream, dev.scheduler_stream)
            output = dev.forward(batch, dev.engine_stream)
            return Launched(batch, reqs, output, dev.record(dev.engine_stream))

    def _process(self, launched: Launched) -> None:
        with self.device.span("process", work=len(launched.reqs)):
            launched.copy_done.synchronize()
            for req, token in zip(launched.reqs, launched.output.tokens(), strict=True):
                req.inflight -= 1
                if not req.done:  # (the extra round of a finished or aborted request: dropped)
                    req.received += 1
                    eos = token == self.config.eos_token_id
                    last = eos and not req.msg.sampling_params.ignore_eos
                    finished = last or req.received == req.max_output
                    self.sink(TokenMsg(req.msg.uid, token, finished))
                    if finished:
                        req.done = True
                        del self.live[req.msg.uid]
                        self.running.remove(req)
                self._release(req)


make_scheduler: SchedulerFactory = MinimalScheduler  # the class is the factory
