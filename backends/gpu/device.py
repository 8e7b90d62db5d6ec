"""`TorchDevice`: the device seam on a real torch device.

On CUDA: a scheduler stream and an engine stream (`torch.cuda.Stream`), CUDA events, pinned host
buffers and `non_blocking` copies, so stream work really runs asynchronously to the host and to the
other stream; spans are NVTX ranges and each stream operation's start and end come from CUDA
events. On CPU the same calls run synchronously, in issue order.

The trace is recorded exactly as the simulator records it (same ops, kinds, labels, footprints via
`FootprintRecorder`), so `no-race` and the timeline work on real runs.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from overlapcheck.backends.delays import Delay, DelayInjector
from overlapcheck.backends.gates import (
    DEFAULT_BOUND,
    HOST_BOUND,
    Gate,
    GateKeeper,
    GateOutcome,
    HostGates,
)
from overlapcheck.backends.gpu.engine import Engine
from overlapcheck.backends.gpu.sanitizer import Sanitizer
from overlapcheck.core.batch import BatchInput, RowWrite
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.contract import check_batch_size, check_rows
from overlapcheck.core.device import (
    HOST_WORK_BEFORE_ISSUE,
    Device,
    Event,
    ForwardOutput,
    KvCopy,
    Stream,
)
from overlapcheck.core.footprints import FootprintRecorder
from overlapcheck.core.messages import SamplingParams
from overlapcheck.core.speculative import is_verify, output_size, parse_output
from overlapcheck.core.trace import (
    DRAFT_POOL,
    HOST,
    KV_LOAD,
    KV_OFFLOAD,
    PAGE_TABLE,
    TOKEN_POOL,
    Op,
    Trace,
    Verified,
)


class TorchEvent(Event):
    def __init__(self, device: TorchDevice, event_id: int, cuda: torch.cuda.Event | None) -> None:
        self.id, self.device, self.cuda = event_id, device, cuda

    def synchronize(self) -> None:
        self.device.host_wait(self)

    def query(self) -> bool:
        fired = self.cuda is None or bool(self.cuda.query())
        if fired:
            self.device.recorder.host_query(self.id, self.device.now())
        return fired


class TorchOutput(ForwardOutput):
    def __init__(self, device: TorchDevice, batch: BatchInput, host_buffer: torch.Tensor) -> None:
        self.device, self.batch, self.host_buffer = device, batch, host_buffer

    def tokens(self) -> list[int]:
        if is_verify(self.batch):
            return [t[0] for t in self.emitted()]
        with self.device.guard():
            op = self.device.recorder.output_read(self.batch, self.device.now())
            tokens = [int(t) for t in self.host_buffer.tolist()]
        if self.device.gates is not None:
            self.device.gates.after(op)
        return tokens

    def emitted(self) -> list[list[int]]:
        if not is_verify(self.batch):
            return super().emitted()
        with self.device.guard():
            self.device.recorder.output_read(self.batch, self.device.now())
            return parse_output(self.batch, [int(t) for t in self.host_buffer.tolist()])


class EventClock:
    """Maps CUDA event times onto the host clock and fills stream ops' start/end once they ran."""

    def __init__(self, stream: torch.cuda.Stream, host_clock: Callable[[], float]) -> None:
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record(stream)
        self.anchor.synchronize()
        self.anchor_time = host_clock()  # read once the anchor has fired, not before recording it
        self.pending: deque[tuple[Op, torch.cuda.Event, torch.cuda.Event]] = deque()

    def add(self, op: Op, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self.pending.append((op, start, end))

    def resolve(self) -> None:
        while self.pending and self.pending[0][2].query():
            op, start, end = self.pending.popleft()
            op.start = self.anchor_time + self.anchor.elapsed_time(start) / 1e3
            op.end = self.anchor_time + self.anchor.elapsed_time(end) / 1e3


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """What a run on the real engine does besides the scheduler's work, fixed when its device is
    made: a replayed counterexample's delays and gates (replay/gpu.py), and
    calibration's holds: stream ops of these kinds first hold their stream this long, so that the
    host has queued all their work before they start and their event span is device time."""

    delays: tuple[Delay, ...] = ()
    gates: tuple[Gate, ...] = ()
    gate_bound: float = DEFAULT_BOUND  # the longest a held op waits for its gate
    hold: Mapping[str, float] = field(default_factory=dict)


class TorchDevice(Device):
    def __init__(
        self,
        config: SchedulerConfig,
        engine: Engine,
        sanitizer: Sanitizer | None = None,
        sampling: dict[int, SamplingParams] | None = None,
        plan: DevicePlan | None = None,
        sleep_rate: float = 0.0,
    ) -> None:
        self.config, self.engine, self.sanitizer = config, engine, sanitizer
        self.sampling = sampling or {}
        plan = plan if plan is not None else DevicePlan()
        self.injector = DelayInjector(list(plan.delays)) if plan.delays else None
        self.sleep_rate = sleep_rate  # torch.cuda._sleep cycles per second
        self.hold = dict(plan.hold)
        self.cuda = engine.model.device.type == "cuda"
        self.trace = Trace()
        self.recorder = FootprintRecorder(config, self.trace)
        self.scheduler_stream, self.engine_stream = Stream("scheduler"), Stream("engine")
        self.transfer_stream = Stream("transfer")  # KV offload and load: a copy stream of its own
        self.host_kv: dict[int, torch.Tensor] = {}  # pinned host buffers of KV copies
        self._verify_outputs: list[TorchOutput] = []  # read into `trace.verified` at `finish`
        self._t0 = time.perf_counter()
        self.staging = torch.full(
            (self.recorder.metadata_width,), -1, dtype=torch.int32, pin_memory=self.cuda
        )
        self._streams: dict[str, torch.cuda.Stream] = {}
        self.clock: EventClock | None = None
        if self.cuda:
            names = (
                self.scheduler_stream.name,
                self.engine_stream.name,
                self.transfer_stream.name,
            )
            self._streams = {name: torch.cuda.Stream() for name in names}
            torch.cuda.synchronize()  # buffers were filled on the default stream
            self.clock = EventClock(self._streams["engine"], self.now)
        # A replay's gates (see backends/gates.py); None when the run has none.
        self.gates = self._gates(list(plan.gates), plan.gate_bound)

    def _gates(self, gates: list[Gate], bound: float) -> GateKeeper | None:
        """Hold these ops behind their gates in this run; a held op waits `bound` seconds at most
        (on the CPU engine, which cannot open one, `HOST_BOUND`)."""
        if not gates:
            return None
        if self.cuda:
            from overlapcheck.backends.gpu.spin_gates import SpinGates

            driver: SpinGates | HostGates = SpinGates(len(gates), self._streams, bound)
        else:
            driver = HostGates(len(gates), min(bound, HOST_BOUND))
        return GateKeeper(gates, driver, self.trace)

    def gate_outcomes(self) -> list[GateOutcome]:
        """What each gate did; after `finish`."""
        return self.gates.outcomes() if self.gates is not None else []

    # -- host side ----------------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def released(self, resource: str, ids: Sequence[int]) -> None:
        self.recorder.release(resource, ids)

    def set_step(self, step: int) -> None:
        self.recorder.step = step

    @contextlib.contextmanager
    def span(self, phase: str, work: int = 0) -> Iterator[None]:
        outer = self.recorder.phase
        self.recorder.phase = phase
        op = self.recorder.span(phase, self.now(), work)
        if self.cuda:
            torch.cuda.nvtx.range_push(phase)
        delay = self.injector.take(op.step, HOST, "span") if self.injector is not None else 0.0
        if delay and phase in HOST_WORK_BEFORE_ISSUE:
            time.sleep(delay)  # where the simulator charges it (core/device.py)
        try:
            yield
        finally:
            if delay and phase not in HOST_WORK_BEFORE_ISSUE:
                time.sleep(delay)
            if self.cuda:
                torch.cuda.nvtx.range_pop()
            op.end = self.now()
            self.recorder.phase = outer

    def sleep_until(self, time_s: float) -> None:
        start = self.now()
        if time_s > start:
            time.sleep(time_s - start)
        self.recorder.idle(start, self.now())

    def host_wait(self, event: TorchEvent) -> None:
        if self.gates is not None:
            self.gates.host_blocks(event.id)
        op = self.recorder.host_wait(event.id, self.now())
        if event.cuda is not None:
            with self.guard():
                event.cuda.synchronize()
        op.end = self.now()
        if self.clock is not None:
            self.clock.resolve()

    def guard(self) -> contextlib.AbstractContextManager[None]:
        return self.sanitizer.guard() if self.sanitizer is not None else contextlib.nullcontext()

    # -- stream side --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _enqueue(self, stream: Stream, op: Op) -> Iterator[None]:
        """Issue the block's work on `stream`, bracketed by timing events (CPU: run it now)."""
        gates = self.gates
        with self.guard():
            if not self.cuda:
                if gates is not None:
                    gates.before(op)
                op.start = self.now()
                yield
                op.end = self.now()
                if gates is not None:
                    gates.after(op)
                return
            s = self._streams[stream.name]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(s):
                self._inject(op)
                if gates is not None:
                    gates.before(op)  # the gate's wait goes before the op's timing starts
                start.record(s)
                yield
                end.record(s)
                if gates is not None:
                    gates.after(op)
            assert self.clock is not None
            self.clock.add(op, start, end)

    def _inject(self, op: Op) -> None:
        """A replayed delay or a calibration hold: the stream sleeps just before the operation
        (queued on the stream; the host does not wait)."""
        delay = self.hold.get(op.kind, 0.0)
        if self.injector is not None:
            delay += self.injector.take(op.step, op.agent, op.kind)
        if delay and self.sleep_rate:
            torch.cuda._sleep(int(delay * self.sleep_rate))

    def copy_to_device(self, buffer: str, writes: Sequence[RowWrite], stream: Stream) -> None:
        check_rows(self.config, buffer, writes)
        pools = self.engine.pools
        targets = {
            TOKEN_POOL: pools.token_pool,
            PAGE_TABLE: pools.page_table,
            DRAFT_POOL: pools.draft_pool,
        }
        target = targets[buffer]
        op = self.recorder.op(
            stream.name,
            "h2d",
            self.now(),
            label=f"h2d {buffer}",
            accesses=[self.recorder.rows(buffer, writes)],
        )
        values = [np.asarray(w.values, dtype=np.int32) for w in writes]
        host = torch.empty(sum(len(v) for v in values), dtype=torch.int32, pin_memory=self.cuda)
        if len(host):
            host.numpy()[:] = np.concatenate(values)  # captured now: a fresh pinned buffer per call
        with self._enqueue(stream, op):
            offset = 0
            for w, v in zip(writes, values, strict=True):
                target[w.row, w.start : w.start + len(v)].copy_(
                    host[offset : offset + len(v)], non_blocking=True
                )
                offset += len(v)

    def offload_kv(self, uid: int, cells: Sequence[int], stream: Stream) -> KvCopy:
        pools = self.engine.pools
        saved = KvCopy(len(self.host_kv), uid, len(cells))
        op = self.recorder.kv_copy(KV_OFFLOAD, stream.name, self.now(), saved, cells)
        layers = [t.view(-1, *t.shape[2:]) for t in (*pools.k, *pools.v)]  # per cell
        host = torch.empty(
            (len(layers), len(cells), *layers[0].shape[1:]),
            dtype=layers[0].dtype,
            pin_memory=self.cuda,
        )
        self.host_kv[saved.id] = host
        index = torch.tensor(list(cells), dtype=torch.long, pin_memory=self.cuda)
        with self._enqueue(stream, op):
            at = index.to(layers[0].device, non_blocking=True)
            for i, layer in enumerate(layers):
                host[i].copy_(layer.index_select(0, at), non_blocking=True)
        return saved

    def load_kv(self, saved: KvCopy, cells: Sequence[int], stream: Stream) -> None:
        pools = self.engine.pools
        op = self.recorder.kv_copy(KV_LOAD, stream.name, self.now(), saved, cells)
        layers = [t.view(-1, *t.shape[2:]) for t in (*pools.k, *pools.v)]
        host = self.host_kv[saved.id]
        index = torch.tensor(list(cells), dtype=torch.long, pin_memory=self.cuda)
        with self._enqueue(stream, op):
            at = index.to(layers[0].device, non_blocking=True)
            for i, layer in enumerate(layers):
                layer.index_copy_(0, at, host[i].to(layer.device, non_blocking=True))

    def stage_metadata(self, batch: BatchInput, stream: Stream) -> Event:
        check_batch_size(self.config, batch)  # the forward checks the rest
        flat = batch.metadata(self.recorder.fields)
        self.staging.numpy()[: len(flat)] = flat  # the host rewrites the one staging buffer now
        staged = self.recorder.staging_write(batch, self.now())
        if self.gates is not None:
            self.gates.after(staged)
        op = self.recorder.metadata_copy(batch, stream.name, self.now())
        with self._enqueue(stream, op):
            parity = batch.batch_id % 2
            slot = self.engine.pools.metadata[parity, : len(flat)]
            slot.copy_(self.staging[: len(flat)], non_blocking=True)
            self.engine.plan(batch, self._params(batch))  # FlashInfer's plan: host work + H2D here
        return self.record(stream)

    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        self.wait_event(waiter, self.record(waitee))

    def record(self, stream: Stream) -> Event:
        event = TorchEvent(
            self,
            self.trace.new_event_id(),
            torch.cuda.Event(enable_timing=True) if self.cuda else None,
        )
        op = self.recorder.op(
            stream.name, "record", self.now(), label=f"record e{event.id}", records=event.id
        )
        self._mark(stream, op, event.cuda)
        if self.gates is not None:
            self.gates.recorded(stream.name, event.id)
        return event

    def wait_event(self, stream: Stream, event: Event) -> None:
        assert isinstance(event, TorchEvent)
        op = self.recorder.op(
            stream.name, "wait", self.now(), label=f"wait e{event.id}", waits=event.id
        )
        if event.cuda is not None:
            with self.guard():
                self._streams[stream.name].wait_event(event.cuda)
        self._mark(stream, op, torch.cuda.Event(enable_timing=True) if self.cuda else None)
        if self.gates is not None:
            self.gates.waited(stream.name, event.id)

    def _mark(self, stream: Stream, op: Op, event: torch.cuda.Event | None) -> None:
        """A zero-length op: its time is when the stream reaches `event` (CPU: now)."""
        if event is None:
            op.start = op.end = self.now()
            return
        with self.guard():
            event.record(self._streams[stream.name])
        assert self.clock is not None
        self.clock.add(op, event, event)

    def forward(self, batch: BatchInput, stream: Stream) -> ForwardOutput:
        kernel = self.recorder.forward(batch, stream.name, self.now())
        copy = self.recorder.d2h(batch, stream.name, self.now())
        # -1 until the copy lands, as on the simulator: a too-early read shows.
        size = output_size(batch) if is_verify(batch) else len(batch.seqs)
        host = torch.full((size,), -1, dtype=torch.int32, pin_memory=self.cuda)
        if self.cuda:
            torch.cuda.nvtx.range_push(f"forward {batch.label}")
        try:
            with self._enqueue(stream, kernel):
                sampled = self.engine.run(batch, self._params(batch))
            with self._enqueue(stream, copy):
                host.copy_(sampled, non_blocking=True)
        finally:
            if self.cuda:
                torch.cuda.nvtx.range_pop()
        output = TorchOutput(self, batch, host)
        if is_verify(batch):
            self._verify_outputs.append(output)
        return output

    def resolve(self, batch: BatchInput, stream: Stream) -> None:
        op = self.recorder.resolve(batch, stream.name, self.now())
        with self._enqueue(stream, op):
            self.engine.resolve(batch)

    def _params(self, batch: BatchInput) -> list[SamplingParams | None]:
        return [self.sampling.get(s.uid) for s in batch.seqs]

    def finish(self) -> None:
        """Wait for all stream work and fill in the remaining op times (for tools; a run's last
        host wait already covers everything it issued)."""
        if self.gates is not None:
            self.gates.host_blocks(None)
        if self.cuda:
            torch.cuda.synchronize()
            assert self.clock is not None
            self.clock.resolve()
        self._record_verified()

    def _record_verified(self) -> None:
        """Each verify sequence's emitted count, from the output buffers once the device has
        finished (the first draft's position was resolved on the device: not known here)."""
        for out in self._verify_outputs:
            seqs = out.batch.seqs
            counts = out.host_buffer[len(out.host_buffer) - len(seqs) :].tolist()
            self.trace.verified += [
                Verified(out.batch.batch_id, i, s.uid, -1, s.drafts, int(e))
                for i, (s, e) in enumerate(zip(seqs, counts, strict=True))
            ]
        self._verify_outputs.clear()

    def __repr__(self) -> str:
        where = "cuda" if self.cuda else "cpu"
        return f"TorchDevice({where}, t={self.now():.6f}s, ops={len(self.trace.ops)})"
