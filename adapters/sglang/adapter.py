"""SGLang's own `Scheduler` as a scheduler under test, on the simulated CUDA (default) or on
`device="cpu"`.

`Scheduler.run_event_loop` runs as it ships, in a greenlet: it publishes its stream context and
dispatches to `event_loop_overlap` (or `event_loop_normal` with `--loop normal`), which never
returns. Each iteration of that loop begins with `request_receiver.recv_requests()`; the stand-in
receiver (`transport.py`) is where one `step()` ends and the next begins: the loop is suspended
there and resumed by the next `step()`, which hands it the messages that have arrived. Nothing
of SGLang's is edited; a subclass marks its host phases (schedule, launch, process) for the
timeline, each calling SGLang's method unchanged.

The model worker, its memory pools and radix tree, the sampler and the FutureMap are SGLang's
own; the model is the toy model (`toy.py`). On the simulated CUDA (`simcuda.py`) its schedule,
forward and copy streams are agents of the trace and the forward is one kernel on the forward
stream (`kernel.py`): the streams are judged too. On `device="cpu"` its streams are no-ops and its
forward runs at once, so that mode judges the request lifecycle (every invariant on the messages,
the oracle on the tokens, SGLang's own `SchedulerInvariantChecker` each iteration), not the
streams.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any

import greenlet
import torch
import zmq

from overlapcheck.adapters.base import UpstreamScheduler
from overlapcheck.adapters.sglang.books import read_books
from overlapcheck.adapters.sglang.build import build
from overlapcheck.adapters.sglang.kernel import DeviceForward
from overlapcheck.adapters.sglang.simcuda import name_streams, standing_in
from overlapcheck.adapters.sglang.toy import HOLDER
from overlapcheck.adapters.sglang.transport import Receiver, Sender, Transport
from overlapcheck.adapters.sglang.upstream import load_sglang
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.torchsim.peek import peeked, peeking
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import UserError
from overlapcheck.core.protocol import Books, MessageSink, MessageSource
from overlapcheck.core.trace import KV

# `OVERLAPCHECK_SGLANG_DEVICE=cpu`: make_scheduler runs SGLang on device="cpu" (default: the
# simulated CUDA).
DEVICE_ENV = "OVERLAPCHECK_SGLANG_DEVICE"

# The Scheduler methods the adapter calls or wraps.
METHODS = (
    "run_event_loop",
    "event_loop_overlap",
    "event_loop_normal",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
    "is_fully_idle",
)


class SglangScheduler(UpstreamScheduler):
    """Drives SGLang's Scheduler one event-loop iteration per `step()`: on the simulated CUDA
    (`simulated`, its streams as agents) or on `device="cpu"`."""

    def __init__(
        self,
        config: SchedulerConfig,
        device: SimDevice,
        source: MessageSource,
        sink: MessageSink,
        simulated: bool = True,
    ) -> None:
        loaded = load_sglang()
        super().__init__(config, device, source, sink, loaded)
        self.sim = device
        self.cuda = SimulatedCuda(device) if simulated else None
        self.transport = Transport(loaded, config, self.front)
        self.started = False
        self.over = False
        self.loop_grad = torch.is_grad_enabled()
        base = loaded["sglang.srt.managers.scheduler"].Scheduler
        loaded.require_methods(base, METHODS)
        with self._block(), self._quiet_torch():
            self.sched = build(
                loaded,
                self._checked(base),
                config,
                "cpu" if self.cuda is None else "cuda",
                simulated=self.cuda is not None,
            )
            if self.cuda is not None:
                self.forward = self._device_forward(self.cuda)
                # A server's start-up ends with the device idle (CUDA graph capture, off here,
                # ends with a synchronize; its warm-up request runs before any user's).
                torch.cuda.synchronize()
        self._unplug(Sender(self.transport))
        self.sched.request_receiver = Receiver(self._pull)
        self.loop = greenlet.greenlet(self.sched.run_event_loop)

    def _device_forward(self, cuda: SimulatedCuda) -> DeviceForward:
        """Its streams named as the trace's agents, its pools' buffers named, and the toy
        model's forward kernel over them."""
        sched = self.sched
        runner = sched.tp_worker.model_runner
        name_streams(cuda, {
            "schedule": sched.schedule_stream, "forward": runner.forward_stream,
            "copy": sched.copy_stream,
        })  # fmt: skip
        _peek_checks(sched.invariant_checker)
        keys = runner.token_to_kv_pool.get_key_buffer(0)
        rows = sched.req_to_token_pool.req_to_token
        cuda.name(rows, "req_to_token")
        cuda.name(keys, KV)
        return DeviceForward(cuda, self.sim.model, keys, rows)

    @contextlib.contextmanager
    def _block(self) -> Iterator[None]:
        """Inside: the simulated CUDA and SGLang's stand-ins for it (none on the cpu)."""
        if self.cuda is None:
            yield
            return
        with self.cuda, standing_in(self.loaded, self.cuda):
            yield

    def _unplug(self, sender: Sender) -> None:
        """Its ZeroMQ sockets closed (nothing is at their other end), its senders' `send_output`
        given to the stand-in; the receiver is replaced."""
        channels = self.sched.ipc_channels
        for field in getattr(type(channels), "__dataclass_fields__", {}):
            value = getattr(channels, field)
            _close(value)
            if hasattr(value, "send_output"):
                value.send_output = sender.send_output
        self.sched.output_streamer.send_to_detokenizer = sender

    def _checked(self, base: type) -> type:
        device = self.sim

        class Checked(base):  # type: ignore[misc]
            def get_next_batch_to_run(self, *args: Any, **kwargs: Any) -> Any:
                with device.span("schedule", len(self.waiting_queue)):
                    return super().get_next_batch_to_run(*args, **kwargs)

            def run_batch(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
                with device.span("launch", len(batch.reqs)):
                    return super().run_batch(batch, *args, **kwargs)

            def process_batch_result(self, batch: Any, result: Any) -> Any:
                with device.span("process", len(batch.reqs)):
                    return super().process_batch_result(batch, result)

        return Checked

    @contextlib.contextmanager
    def _quiet_torch(self) -> Iterator[None]:
        """SGLang's loop runs with gradients off (`DynamicGradMode`); that is thread state, which
        a greenlet does not keep apart: it is the loop's inside a step, the caller's outside."""
        outside = torch.is_grad_enabled()
        torch.set_grad_enabled(self.loop_grad)
        try:
            yield
        finally:
            self.loop_grad = torch.is_grad_enabled()
            torch.set_grad_enabled(outside)

    def step(self) -> bool:
        if self.over:
            return False
        HOLDER.model = self.sim.model
        HOLDER.kv_pool = self.sched.tp_worker.model_runner.token_to_kv_pool
        HOLDER.req_to_token = self.sched.req_to_token_pool.req_to_token
        HOLDER.device_forward = self.forward if self.cuda is not None else None
        with self._block(), self._quiet_torch():
            more = self.loop.switch()
            if not more:  # over: the loop unwinds now, not whenever it is collected
                self.loop.throw(greenlet.GreenletExit)
                if self.cuda is not None:
                    self.cuda.drain()
        return bool(more)

    def _pull(self) -> list[Any]:
        """Inside the loop, at the start of each iteration: the iteration before is one step."""
        if self.started:
            self._yield(True)
        self.started = True
        msgs = self.receive(holding=not self.sched.is_fully_idle())
        if msgs is None:
            self.over = True
            self._yield(False)  # the run is over: the loop is never resumed
        return self.transport.inbound(msgs or [])

    def _yield(self, more: bool) -> None:
        parent = self.loop.parent
        assert parent is not None
        parent.switch(more)

    def vocabulary(self) -> Mapping[str, str]:
        """SGLang's words (`HasVocabulary`): a slot is a row of its `ReqToTokenPool`."""
        return {"slot": "req_pool_idx"}

    def books(self) -> Books:
        if self.cuda is None:
            return read_books(self.sched)
        with peeking():  # its device values as the program sees them, untraced
            return read_books(self.sched)


def _peek_checks(checker: Any) -> None:
    """SGLang's own checker, its methods run inside `peeking()`: they read its books in program
    order, as on the cpu, without the synchronizations their device reads would add (they are
    debug checks, not what the loop does). A subclass of its class, given to the object."""
    base = type(checker)
    peeked_class = type(base.__name__, (base,), {"__slots__": ()})
    for name, value in vars(base).items():
        if inspect.isfunction(value) and not name.startswith("__"):
            setattr(peeked_class, name, peeked(value))
    checker.__class__ = peeked_class


def _close(value: Any) -> None:
    socket = getattr(value, "socket", value)
    if isinstance(socket, zmq.Socket) and not socket.closed:
        socket.close(linger=0)


def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_scheduler`: on the simulated CUDA, its
    schedule, forward and copy streams as agents (runs on the simulator).
    `OVERLAPCHECK_SGLANG_DEVICE=cpu` in the environment runs it on `device="cpu"` instead
    (`make_cpu_scheduler`)."""
    if not isinstance(device, SimDevice):
        raise UserError("the SGLang adapter runs on the simulator only (--backend sim)")
    mode = os.environ.get(DEVICE_ENV, "cuda")
    if mode not in ("cuda", "cpu"):
        raise UserError(f"{DEVICE_ENV}={mode}: the SGLang adapter runs on cuda (simulated) or cpu")
    return SglangScheduler(config, device, source, sink, simulated=mode == "cuda")


def make_cpu_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_cpu_scheduler`: on `device="cpu"`, where
    its streams are no-ops (the request lifecycle judged, not the streams)."""
    if not isinstance(device, SimDevice):
        raise UserError("the SGLang adapter runs on the simulator only (--backend sim)")
    return SglangScheduler(config, device, source, sink, simulated=False)
