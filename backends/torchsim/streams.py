"""Streams, events and host waits of the simulated CUDA, on the simulator's SimPy model.

Each stream is a SimPy process that runs its queued operations in issue order; copies book the
copy engines and kernels the compute unit of the `SimDevice` (FIFO, by time), so two streams
contend for the hardware as on a GPU. Events fire when the work before them has run. The host
advances only through the device: a blocking wait runs the environment until the awaited event
fires, and a wait on an event that can never fire is a `liveness` violation (`DeadlockError`).

Every call is traced with the ordering it implies (`records` / `waits` on the trace's ops), so the
race checker's happens-before sees exactly the synchronisation the program did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from overlapcheck.backends.sim.device import DeadlockError, SimDevice, Unit
from overlapcheck.backends.torchsim.guards import plain
from overlapcheck.core.sites import Site, caller
from overlapcheck.core.trace import HOST, Op

Body = Callable[[], Generator[simpy.Event, Any, None]]


@dataclass(eq=False, slots=True)
class Launch:
    """One stream op: its trace op, the unit it books for how long, and what it computes: at
    its start, `start` runs and returns what to run at its end."""

    op: Op
    unit: Unit
    duration: float
    start: Callable[[], Callable[[], None]]


@dataclass(eq=False, slots=True)  # (not frozen: that `__init__` goes through object.__setattr__)
class _Fire:
    """A recording's turn on its stream: the marker fires (`op`: its trace op, if traced)."""

    op: Op | None
    marker: Marker


@dataclass(eq=False, slots=True)  # (not frozen: that `__init__` goes through object.__setattr__)
class _Wait:
    """A stream's wait for a marker (`StreamRuntime.wait_event`), traced as `op`."""

    op: Op
    marker: Marker


# Host time one poll of `Event.query()` costs: a loop that spins on it moves simulated time.
POLL = 1e-6
# A site not looked up yet (`StreamRuntime.record`'s caller found none): distinct from None, a
# site looked up that is not the scheduler's.
UNKNOWN: Any = object()


class SimStream:
    """A stream: `torch.cuda.Stream` as schedulers use it. `name` is its agent in the trace."""

    def __init__(self, runtime: StreamRuntime, name: str) -> None:
        self.runtime = runtime
        self.name = name
        # what it runs, in issue order: the kinds `_loop` runs itself (no generator of their
        # own: thousands an iteration), or a body
        self.ops: deque[Launch | _Fire | _Wait | Body] = deque()
        self.wakeup: simpy.Event | None = None
        self.device = runtime.torch_device
        self.device_index = 0
        self.stream_id = len(runtime.streams)
        self.cuda_stream = self.stream_id  # (the handle a program may log or compare)
        self._before: list[SimStream] = []  # the streams current before each `with` entry
        runtime.env.process(self._loop())

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        runtime = self.runtime
        env = runtime.env
        ops = self.ops
        while True:
            if not ops:
                self.wakeup = env.event()
                yield self.wakeup
            item = ops.popleft()
            kind = type(item)
            if kind is Launch:
                assert isinstance(item, Launch)
                # wait for its unit (FIFO) and book it (`StreamRuntime.acquire`, inline)
                unit, duration = item.unit, item.duration
                now = env.now
                start = max(float(now), unit.free_at)
                unit.free_at = start + duration
                if start > now:
                    yield env.timeout(start - now)
                item.op.start = start
                end = item.start()
                yield env.timeout(duration)
                end()
                item.op.end = float(env.now)
            elif kind is _Fire:
                assert isinstance(item, _Fire)
                at = float(env.now)
                if item.op is not None:
                    item.op.start = item.op.end = at
                runtime.fired_at[item.marker.id] = at
                item.marker.fired.succeed()
            elif kind is _Wait:
                assert isinstance(item, _Wait)
                item.op.start = float(env.now)
                yield item.marker.fired
                item.op.end = float(env.now)
            else:
                assert callable(item)
                yield from item()

    def enqueue(self, body: Launch | _Fire | _Wait | Body) -> None:
        self.ops.append(body)
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    # -- torch.cuda.Stream's methods -----------------------------------------------------------

    def wait_stream(self, stream: SimStream) -> None:
        """Work issued here from now on runs after all work issued on `stream` so far."""
        self.runtime.wait_event(self, self.runtime.record(stream))

    def wait_event(self, event: SimCudaEvent) -> None:
        event.wait(self)

    def record_event(self, event: SimCudaEvent | None = None) -> SimCudaEvent:
        event = event if event is not None else SimCudaEvent(self.runtime)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.runtime.host_wait(self.runtime.record(self), "stream.synchronize")

    def query(self) -> bool:
        """Whether everything issued here has run (untraced, as a poll)."""
        return not self.ops and self.wakeup is not None and not self.wakeup.triggered

    def __enter__(self) -> SimStream:
        """`with stream:` (a `torch.Stream` is a context manager): current inside, the stream
        current before it again after."""
        self._before.append(self.runtime.current)
        self.runtime.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.runtime.current = self._before.pop()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<simulated cuda stream {self.name}>"


class Marker:
    """One recording of an event: its trace id and the SimPy event that fires when it runs."""

    def __init__(self, runtime: StreamRuntime, event_id: int) -> None:
        self.id = event_id
        self.fired = runtime.env.event()
        self.runtime = runtime

    def query(self) -> bool:
        return bool(self.fired.triggered)


class SimCudaEvent:
    """`torch.cuda.Event`: recorded on a stream, waited for by a stream or the host. An event
    never recorded counts as complete, as on CUDA."""

    def __init__(self, runtime: StreamRuntime, *args: Any, **kwargs: Any) -> None:
        self.runtime = runtime
        self.marker: Marker | None = None

    def record(self, stream: SimStream | None = None) -> None:
        stream = stream if stream is not None else self.runtime.current
        self.marker = self.runtime.record(stream)

    def wait(self, stream: SimStream | None = None) -> None:
        if self.marker is not None:
            stream = stream if stream is not None else self.runtime.current
            self.runtime.wait_event(stream, self.marker)

    def synchronize(self) -> None:
        if self.marker is not None:
            self.runtime.host_wait(self.marker, "event.synchronize")

    def query(self) -> bool:
        runtime = self.runtime
        if self.marker is None:
            return True
        runtime.device._advance(POLL)
        if not self.marker.query():
            return False
        runtime.observe(self.marker)  # seeing it complete orders the host after it
        return True

    def elapsed_time(self, end: SimCudaEvent) -> float:
        if self.marker is None or end.marker is None:
            raise RuntimeError("elapsed_time needs two recorded events")
        self.runtime.host_wait(end.marker, "elapsed_time")
        return 1000.0 * (
            self.runtime.fired_at[end.marker.id] - self.runtime.fired_at[self.marker.id]
        )


class StreamRuntime:
    """The streams of one run on a SimDevice's environment, and the host's waits on them."""

    def __init__(self, device: SimDevice, torch_device: Any, names: tuple[str, ...]) -> None:
        self.device = device
        self.env = device.env
        device.guard = plain  # simulated time runs the streams' ops, each under `plain`
        self.torch_device = torch_device
        self.streams: list[SimStream] = []
        self._names = list(names)
        self.default = self.new_stream("default")
        self.current = self.default
        self.fired_at: dict[int, float] = {}
        # Run before the host blocks (a safe point between ops): the allocators see the frees
        # the program made since its last op, as PyTorch's see them when they happen.
        self.before_wait: list[Callable[[], None]] = []

    def new_stream(self, name: str | None = None) -> SimStream:
        """A stream named `name`, else the next of the names the run was given, else `streamN`."""
        if name is None:
            name = self._names.pop(0) if self._names else f"stream{len(self.streams)}"
        stream = SimStream(self, name)
        self.streams.append(stream)
        return stream

    def now(self) -> float:
        return float(self.env.now)

    def op(self, agent: str, kind: str, **fields: Any) -> Op:
        return self.device.recorder.op(agent, kind, self.now(), **fields)

    def op_at(self, agent: str, kind: str, site: Site | None, **fields: Any) -> Op:
        """`op` with the site of the call already found (`dispatch.origin`)."""
        return self.device.recorder.op_at(agent, kind, float(self.env.now), site, **fields)

    def acquire(self, unit: Unit, duration: float) -> Generator[simpy.Event, Any, float]:
        """Wait for `unit` (FIFO) and book it for `duration`; returns the start time."""
        env = self.env
        start = max(float(env.now), unit.free_at)
        unit.free_at = start + duration
        if start > env.now:
            yield env.timeout(start - env.now)
        return start

    def record(
        self, stream: SimStream, traced: bool = True, why: str = "", site: Any = UNKNOWN
    ) -> Marker:
        """A marker that fires once the work issued on `stream` so far has run (`why`: who
        records it, when not the program: an allocator; `site`: the call's site when the
        caller found it already, None included)."""
        marker = Marker(self, self.device.trace.new_event_id())
        label = f"record e{marker.id}" + (f" ({why})" if why else "")
        op = None
        if traced:
            if site is UNKNOWN:
                site = caller()
            op = self.device.recorder.op_at(
                stream.name, "record", float(self.env.now), site, label=label, records=marker.id
            )
        stream.enqueue(_Fire(op, marker))
        return marker

    def wait_event(self, stream: SimStream, marker: Marker) -> None:
        """Work issued on `stream` from now on runs after `marker` fired."""
        op = self.op(stream.name, "wait", label=f"wait e{marker.id}", waits=marker.id)
        stream.enqueue(_Wait(op, marker))

    def host_wait(self, marker: Marker, why: str) -> None:
        """Block the host until `marker` fired (traced as a host wait)."""
        for hook in self.before_wait:
            hook()
        op = self.device.recorder.host_wait(marker.id, self.now())
        op.label = f"{why} e{marker.id}"
        self.run_until(marker, f"host waits on event e{marker.id} that can never fire")
        op.end = self.now()

    def run_until(self, marker: Marker, deadlock: str) -> None:
        """Run the streams until `marker` fired (a deadlock if nothing is left to run first)."""
        try:
            with plain():  # (the streams' ops find it entered: `SimDevice.guard`)
                self.env.run(until=marker.fired)
        except RuntimeError as err:
            if marker.fired.triggered or "No scheduled events left" not in str(err):
                raise
            raise DeadlockError(deadlock) from err

    def observe(self, marker: Marker, why: str = "", site: Any = UNKNOWN) -> None:
        """The host saw `marker` complete without blocking (a successful query; `site` as for
        `record`)."""
        recorder = self.device.recorder
        if site is UNKNOWN:
            op = recorder.host_query(marker.id, self.now())
            op.label += f" ({why})" if why else ""
            return
        now = float(self.env.now)
        label = f"query e{marker.id}" + (f" ({why})" if why else "")
        recorder.op_at(
            HOST, "host_query", now, site, label=label, waits=marker.id, start=now, end=now
        )

    def sync_current(self, why: str) -> None:
        """The host waits for the current stream's work so far (an implicit sync)."""
        self.host_wait(self.record(self.current), why)

    def synchronize(self) -> None:
        """`torch.cuda.synchronize()`: the host waits for every stream."""
        for stream in self.streams:
            self.host_wait(self.record(stream), "synchronize")

    def drain(self) -> None:
        """Run every stream's queued work to its end without tracing a wait (end of a run)."""
        markers = [self.record(s, traced=False) for s in self.streams]
        for marker in markers:
            if not marker.fired.triggered:
                self.run_until(marker, "a stream waits on an event that can never fire")
