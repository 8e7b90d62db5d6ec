"""The simulated device: SimPy processes for the streams, numpy buffers with real values.

The host is the scheduler itself. Host time advances only through the device: a span costs
simulated CPU time, a blocking wait runs the environment until the awaited event fires. A kernel
reads its inputs when it starts and writes its outputs when it ends, so a write by the other stream
in between is seen or missed as on hardware.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager, suppress
from typing import Any

import numpy as np
import simpy

from overlapcheck.backends.sim import verify
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
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
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.footprints import FootprintRecorder
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.speculative import is_verify, output_size, parse_output
from overlapcheck.core.trace import (
    DRAFT_POOL,
    KV_LOAD,
    KV_OFFLOAD,
    PAGE_TABLE,
    TOKEN_POOL,
    Trace,
    Verified,
)

OpBody = Callable[[], Generator[simpy.Event, Any, None]]


class Unit:
    """A serial hardware unit (a copy engine, the compute unit): FIFO, one operation at a time.

    Booked by time rather than through a simpy.Resource: same FIFO semantics, no events when free.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0.0


class _StreamQueue:
    def __init__(self, env: simpy.Environment) -> None:
        self.ops: deque[OpBody] = deque()
        self.wakeup: simpy.Event | None = None


# Host time one `Event.query()` costs: time moves only through device calls, so without it a
# scheduler spinning on a query would never see the event fire.
QUERY_COST = 1e-6


class DeadlockError(InvariantError):
    """The host waits on an event that can never fire."""

    def __init__(self, message: str) -> None:
        super().__init__("liveness", message)


class SimEvent(Event):
    def __init__(self, device: SimDevice, event_id: int) -> None:
        self.id = event_id
        self.device = device
        self.fired = simpy.Event(device.env)

    def synchronize(self) -> None:
        self.device.host_wait(self)

    def query(self) -> bool:
        device = self.device
        device._advance(QUERY_COST)
        if not self.fired.triggered:
            return False
        device.recorder.host_query(self.id, device.now())
        return True


class SimOutput(ForwardOutput):
    def __init__(self, device: SimDevice, batch: BatchInput) -> None:
        self.device = device
        self.batch = batch
        size = output_size(batch) if is_verify(batch) else len(batch.seqs)
        self.host_buffer = np.full(size, -1, dtype=np.int64)

    def tokens(self) -> list[int]:
        if is_verify(self.batch):
            return [t[0] for t in self.emitted()]
        self.device.recorder.output_read(self.batch, self.device.now())
        return [int(t) for t in self.host_buffer]

    def emitted(self) -> list[list[int]]:
        if not is_verify(self.batch):
            return super().emitted()
        self.device.recorder.output_read(self.batch, self.device.now())
        return parse_output(self.batch, self.host_buffer.tolist())


class _Span:
    """A host phase (`SimDevice.span`): a class rather than a generator-based context manager,
    since the host enters several per simulated iteration.

    Scheduling and processing cost comes before what they issue or read
    (HOST_WORK_BEFORE_ISSUE). Launching enqueues a forward kernel by kernel: the GPU can start
    `forward_lead` into the phase, but cannot finish before the phase has enqueued the last kernel:
    `forward_tail` from the phase's end (negative when the phase goes on with other host work
    after it).
    """

    __slots__ = ("before", "cost", "device", "op", "outer", "phase", "work")

    def __init__(self, device: SimDevice, phase: str, work: int) -> None:
        self.device = device
        self.phase = phase
        self.work = work

    def __enter__(self) -> None:
        device, phase = self.device, self.phase
        recorder = device.recorder
        self.outer = recorder.phase
        recorder.phase = phase
        self.op = recorder.span(phase, device.now(), self.work)
        self.cost, self.op.delay = device.timing.host(phase, self.work)
        self.before = phase in HOST_WORK_BEFORE_ISSUE
        if self.before:
            device._advance(self.cost)
        if phase == "launch":
            device._launch = (device.now(), device.now() + self.cost)

    def __exit__(self, *exc: object) -> None:
        device = self.device
        if not self.before:
            device._advance(self.cost)
        if self.phase == "launch":
            device._launch = None
        self.op.end = device.now()
        device.recorder.phase = self.outer


class SimDevice(Device):
    def __init__(
        self,
        config: SchedulerConfig,
        model: ToyModel,
        timing: Timing | None = None,
        kv_shadow: KvShadow | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.timing = timing or Timing()
        self.trace = Trace()
        self.recorder = FootprintRecorder(config, self.trace)
        self.env = simpy.Environment()
        # What simulated time runs inside, when not None (the simulated CUDA's `plain`: every
        # stream op's own torch calls then find it entered already, once per run of time
        # rather than twice per op).
        self.guard: Callable[[], AbstractContextManager[Any]] | None = None
        self.scheduler_stream = Stream("scheduler")
        self.engine_stream = Stream("engine")
        self.transfer_stream = Stream("transfer")
        self.h2d_engine = Unit("h2d")
        self.d2h_engine = Unit("d2h")
        self.kv_engine = Unit("kv")  # the transfer stream's copies have a copy engine of their own
        self.compute = Unit("compute")
        self._queues: dict[str, _StreamQueue] = {}
        self._launch: tuple[float, float] | None = None  # while launching: the phase's start, end
        self._loops: list[Generator[simpy.Event, Any, None]] = []
        for stream in (self.scheduler_stream, self.engine_stream, self.transfer_stream):
            queue = self._queues[stream.name] = _StreamQueue(self.env)
            loop = self._stream_loop(queue)
            self._loops.append(loop)
            self.env.process(loop)
        width = config.max_seq_len
        self.token_pool = np.full((config.num_slots + 1, width), -1, dtype=DTYPE)
        self.page_table = np.full((config.num_slots, width), -1, dtype=np.int64)
        self.kv = np.full(config.num_cells, -1, dtype=DTYPE)
        self.metadata = np.full((2, self.recorder.metadata_width), -1, dtype=np.int64)
        self.staging = np.full(self.recorder.metadata_width, -1, dtype=np.int64)
        self.fields = self.recorder.fields
        # Speculation (core/speculative.py): drafts per slot, each verify sequence's emitted count
        # per batch parity (-1: never written, so a placeholder resolved from it stays one).
        self.draft_pool = np.zeros((config.num_slots, max(config.draft_tokens, 1)), dtype=DTYPE)
        self.spec_out = np.full((2, config.num_slots + 1), -1, dtype=np.int64)
        # (forward op seq, sequence index, value) of each placeholder a forward found unresolved.
        self.placeholder_inputs: list[tuple[int, int, int]] = []
        # What each KV cell was computed for; kept only when `kv-provenance` asks for it.
        self.kv_shadow = kv_shadow
        # The pinned host buffers of KV copies: values, and the shadow's record of them.
        self.host_kv: dict[int, tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]] = {}
        self._kv_copies = 0

    # -- host side ----------------------------------------------------------------------------

    def now(self) -> float:
        return float(self.env.now)

    def released(self, resource: str, ids: Sequence[int]) -> None:
        self.recorder.release(resource, ids)

    def set_step(self, step: int) -> None:
        self.recorder.step = step

    def span(self, phase: str, work: int = 0) -> AbstractContextManager[None]:
        return _Span(self, phase, work)

    def sleep_until(self, time: float) -> None:
        start = self.now()
        self._advance(time - start)
        self.recorder.idle(start, self.now())

    def host_wait(self, event: SimEvent) -> None:
        op = self.recorder.host_wait(event.id, self.now())
        try:
            if self.guard is None:
                self.env.run(until=event.fired)
            else:
                with self.guard():
                    self.env.run(until=event.fired)
        except RuntimeError as err:
            raise DeadlockError(f"host waits on event e{event.id} that can never fire") from err
        op.end = self.now()

    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            if self.guard is None:
                self.env.run(until=self.env.now + seconds)
            else:
                with self.guard():
                    self.env.run(until=self.env.now + seconds)

    def close(self) -> None:
        """The run is over: end the streams' loops and drop the work still queued (a run stopped
        at a violation leaves some). Each loop waits in an event of the environment the device
        holds, its frame holding the device, and each queued body holds the device too: cycles
        that kept the whole trace until the next full collection (every run touching fresh
        memory). The clock still reads.

        Each loop gets GeneratorExit thrown in rather than `close()`: CPython 3.12.3 (Ubuntu
        24.04's; 3.12.1 does not) closes a generator waiting at a plain `yield` without clearing
        its frame's locals, so the closed loop still held the device, and the whole trace with
        it, until a full collection. An exception raised out of the frame clears it."""
        for loop in self._loops:
            with suppress(GeneratorExit, StopIteration):
                loop.throw(GeneratorExit)
        self._loops.clear()
        for queue in self._queues.values():
            queue.ops.clear()

    # -- stream side --------------------------------------------------------------------------

    def _stream_loop(self, queue: _StreamQueue) -> Generator[simpy.Event, Any, None]:
        while True:
            if not queue.ops:
                queue.wakeup = simpy.Event(self.env)
                yield queue.wakeup
            yield from queue.ops.popleft()()

    def _enqueue(self, stream: Stream, body: OpBody) -> None:
        queue = self._queues[stream.name]
        queue.ops.append(body)
        if queue.wakeup is not None and not queue.wakeup.triggered:
            queue.wakeup.succeed()

    def _acquire(self, unit: Unit, duration: float) -> Generator[simpy.Event, Any, float]:
        """Wait for `unit` (FIFO) and book it for `duration`; returns the start time."""
        start = max(self.now(), unit.free_at)
        unit.free_at = start + duration
        if start > self.now():
            yield self.env.timeout(start - self.now())
        return start

    def copy_to_device(self, buffer: str, writes: Sequence[RowWrite], stream: Stream) -> None:
        check_rows(self.config, buffer, writes)
        targets: dict[str, np.ndarray] = {
            TOKEN_POOL: self.token_pool,
            PAGE_TABLE: self.page_table,
            DRAFT_POOL: self.draft_pool,
        }
        target = targets[buffer]
        access = self.recorder.rows(buffer, writes)
        op = self.recorder.op(
            stream.name, "h2d", self.now(), label=f"h2d {buffer}", accesses=[access]
        )
        duration, op.delay = self.timing.h2d(len(access.cells))
        captured = [(w.row, w.start, np.asarray(w.values, dtype=target.dtype)) for w in writes]

        shadow = self.kv_shadow if buffer == PAGE_TABLE else None

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = yield from self._acquire(self.h2d_engine, duration)
            yield self.env.timeout(duration)
            for row, start, values in captured:
                target[row, start : start + len(values)] = values
            if shadow is not None:
                shadow.table_write(captured)
            op.end = self.now()

        self._enqueue(stream, body)

    def offload_kv(self, uid: int, cells: Sequence[int], stream: Stream) -> KvCopy:
        saved = KvCopy(self._kv_copies, uid, len(cells))
        self._kv_copies += 1
        op = self.recorder.kv_copy(KV_OFFLOAD, stream.name, self.now(), saved, cells)
        duration, op.delay = self.timing.kv_copy(len(cells))
        at = np.asarray(cells, dtype=np.int64)
        self.host_kv[saved.id] = (np.full(len(at), -1, dtype=DTYPE), None)

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = yield from self._acquire(self.kv_engine, duration)
            values = self.kv[at].copy()  # a copy reads its source when it starts
            shadow = self.kv_shadow.save(at) if self.kv_shadow is not None else None
            yield self.env.timeout(duration)
            self.host_kv[saved.id] = (values, shadow)
            op.end = self.now()

        self._enqueue(stream, body)
        return saved

    def load_kv(self, saved: KvCopy, cells: Sequence[int], stream: Stream) -> None:
        op = self.recorder.kv_copy(KV_LOAD, stream.name, self.now(), saved, cells)
        duration, op.delay = self.timing.kv_copy(len(cells))
        at = np.asarray(cells, dtype=np.int64)

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = yield from self._acquire(self.kv_engine, duration)
            values, shadow = self.host_kv[saved.id]
            values = values.copy()
            yield self.env.timeout(duration)
            self.kv[at] = values
            if self.kv_shadow is not None and shadow is not None:
                self.kv_shadow.restore(at, shadow)
            op.end = self.now()

        self._enqueue(stream, body)

    def stage_metadata(self, batch: BatchInput, stream: Stream) -> Event:
        check_batch_size(self.config, batch)  # the forward checks the rest
        flat = np.asarray(batch.metadata(self.fields), dtype=np.int64)
        self.staging[: len(flat)] = flat
        self.recorder.staging_write(batch, self.now())
        op = self.recorder.metadata_copy(batch, stream.name, self.now())
        duration, op.delay = self.timing.h2d(len(flat))
        parity, n = batch.batch_id % 2, len(flat)

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = yield from self._acquire(self.h2d_engine, duration)
            values = self.staging[:n].copy()  # a copy reads its source when it starts
            yield self.env.timeout(duration)
            self.metadata[parity, :n] = values
            op.end = self.now()

        self._enqueue(stream, body)
        return self.record(stream)

    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        self.wait_event(waiter, self.record(waitee))

    def record(self, stream: Stream) -> Event:
        event = SimEvent(self, self.trace.new_event_id())
        op = self.recorder.op(
            stream.name, "record", self.now(), label=f"record e{event.id}", records=event.id
        )

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = op.end = self.now()
            event.fired.succeed()
            yield from ()

        self._enqueue(stream, body)
        return event

    def wait_event(self, stream: Stream, event: Event) -> None:
        assert isinstance(event, SimEvent)
        op = self.recorder.op(
            stream.name, "wait", self.now(), label=f"wait e{event.id}", waits=event.id
        )

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = self.now()
            yield event.fired
            op.end = self.now()

        self._enqueue(stream, body)

    def _buffers(self) -> verify.Buffers:
        return verify.Buffers(
            self.token_pool, self.page_table, self.kv, self.metadata, self.draft_pool, self.spec_out
        )

    def resolve(self, batch: BatchInput, stream: Stream) -> None:
        op = self.recorder.resolve(batch, stream.name, self.now())
        duration, op.delay = self.timing.cost("forward", self.timing.profile.h2d)
        parity = batch.batch_id % 2
        sources = [(i, s.source) for i, s in enumerate(batch.seqs) if s.source >= 0]

        def body() -> Generator[simpy.Event, Any, None]:
            op.start = yield from self._acquire(self.compute, duration)
            yield self.env.timeout(duration)
            verify.resolve(self._buffers(), parity, sources, self.fields)
            op.end = self.now()

        self._enqueue(stream, body)

    def forward(self, batch: BatchInput, stream: Stream) -> ForwardOutput:
        output = SimOutput(self, batch)
        kernel = self.recorder.forward(batch, stream.name, self.now())
        duration, kernel.delay = self.timing.forward(batch.num_tokens, batch.num_context_tokens)
        copy = self.recorder.d2h(batch, stream.name, self.now())
        copy_duration, copy.delay = self.timing.d2h()
        n = len(batch.seqs)
        parity, spec = batch.batch_id % 2, is_verify(batch)

        first_queued, enqueued_by, copy_queued = 0.0, None, 0.0
        if self._launch is not None:
            profile = self.timing.profile
            first_queued = self._launch[0] + profile.forward_lead
            enqueued_by = self._launch[1] + profile.forward_tail
            copy_queued = self._launch[1] + profile.d2h_queued

        def run_kernel() -> Generator[simpy.Event, Any, None]:
            if first_queued > self.now():
                yield self.env.timeout(first_queued - self.now())
            kernel.start = yield from self._acquire(self.compute, duration)
            if spec:
                vplan, unresolved = verify.read(
                    self.config, self.model, self._buffers(), parity, n, kernel.seq, self.kv_shadow
                )
                self.placeholder_inputs += [(kernel.seq, i, v) for i, v in unresolved]
            else:
                plan = self._read_inputs(parity, n, kernel.seq)
            yield self.env.timeout(duration)
            if enqueued_by is not None and enqueued_by > self.now():
                # Launch-bound: the last kernels run only once the host has enqueued them.
                yield self.env.timeout(enqueued_by - self.now())
                self.compute.free_at = max(self.compute.free_at, self.now())
            if spec:
                verify.write(self._buffers(), vplan, parity, kernel.seq, self.kv_shadow)
                self.trace.verified += [
                    Verified(batch.batch_id, i, s.uid, first, drafts, int(e))
                    for i, (s, first, drafts, e) in enumerate(
                        zip(batch.seqs, vplan.firsts, vplan.drafts, vplan.counts, strict=True)
                    )
                ]
                kernel.end = self.now()
                return
            # One assignment per buffer; where two sequences write one cell, the later one wins,
            # as when they were written one after the other.
            cells, ids, out_rows, out_cols, tokens = plan
            self.kv[cells] = ids
            self.token_pool[out_rows, out_cols] = tokens
            if self.kv_shadow is not None:
                self.kv_shadow.write(kernel.seq, tokens.tolist())
            kernel.end = self.now()

        def run_copy() -> Generator[simpy.Event, Any, None]:
            if copy_queued > self.now():
                # Launch-bound: the stream idles until the host has queued the copy.
                yield self.env.timeout(copy_queued - self.now())
            copy.start = yield from self._acquire(self.d2h_engine, copy_duration)
            if spec:
                values = verify.copy_out(self.config, self._buffers(), parity, n)
            else:
                meta = self.metadata[parity, : n * self.fields].reshape(n, self.fields)
                pool = self.token_pool
                values = pool[meta[:, 3] % pool.shape[0], meta[:, 4] % pool.shape[1]]
            yield self.env.timeout(copy_duration)
            output.host_buffer[:] = values
            copy.end = self.now()

        self._enqueue(stream, run_kernel)
        self._enqueue(stream, run_copy)
        return output

    def _read_inputs(
        self, parity: int, n: int, op: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the kernel reads when it starts: the KV cells it will write and their ids, and
        where each sequence's sampled token goes, and the token."""
        meta = self.metadata[parity, : n * self.fields].reshape(n, self.fields)
        width = self.token_pool.shape[1]
        # Whatever the metadata says (a race may have garbled it), indices wrap into the buffers,
        # as an out-of-bounds read on hardware returns some other cell rather than stopping.
        slots = meta[:, 0] % self.config.num_slots
        # (ufuncs rather than np.clip and .max(): their Python wrappers cost more than the work)
        starts = np.minimum(np.maximum(meta[:, 1], 0), width)
        ends = np.minimum(np.maximum(meta[:, 2], 0), width)
        longest = np.maximum(starts, ends)
        # One gather for the whole batch, of the columns some sequence reads.
        used = int(np.maximum.reduce(longest)) if n else 0
        tables = self.page_table[slots, :used] % len(self.kv)
        pool_rows = self.token_pool[slots, :used]
        cached = self.kv[tables]
        # What each sequence attends over: the cached prefix, then the new ids (both DTYPE, so
        # a row's bytes are the context's); the cells it writes are its new positions, row by row.
        columns = np.arange(used)
        fresh = columns >= starts[:, None]
        context = np.where(fresh, pool_rows, cached)
        new = fresh & (columns < ends[:, None])
        written, ids = tables[new], pool_rows[new]
        if self.kv_shadow is not None:
            self.kv_shadow.read(op, slots, tables, starts, ends, cached, pool_rows, written, ids)
        next_token_of = self.model.next_token_of
        tokens = [
            next_token_of(context[i, :length].tobytes()) if length else -1
            for i, length in enumerate(longest.tolist())
        ]
        return (
            written,
            ids,
            meta[:, 3] % len(self.token_pool),
            meta[:, 4] % width,
            np.array(tokens, dtype=DTYPE),
        )

    def __repr__(self) -> str:
        return f"SimDevice(t={self.now():.6f}s, ops={len(self.trace.ops)})"
