"""The simulated CUDA for the duration of a block: `torch.cuda` stand-ins and the two modes.

    cuda = SimulatedCuda(sim_device, stream_names=("engine", "scheduler"))
    with cuda:
        ...  # torch code: "cuda" tensors, streams, events, pinned memory, non-blocking copies

Outside the block torch is itself again; the simulated tensors made inside keep their buffers and
can be used again in the next block of the same `SimulatedCuda` (a scheduler steps once per block).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from overlapcheck.backends.sim.device import SimDevice, Unit
from overlapcheck.backends.sim.timing import Cost
from overlapcheck.backends.torchsim.dispatch import (
    DispatchMode,
    Interceptor,
    indexing_to,
    pinning,
    plain,
)
from overlapcheck.backends.torchsim.memory import Memory, view_cells
from overlapcheck.backends.torchsim.streams import Launch, SimCudaEvent, SimStream, StreamRuntime
from overlapcheck.backends.torchsim.tensor import SimTensor, SimulatedCudaError, nonzero_of
from overlapcheck.core.trace import Access

# Device memory the stand-in reports free: what `mem_get_info` says (a 141 GB H200's).
FREE_BYTES = 141 * 10**9
# What `get_device_properties` says: an H200's (engines size buffers and pick paths by them).
PROPERTIES = SimpleNamespace(
    name="simulated CUDA",
    total_memory=FREE_BYTES,
    major=9,
    minor=0,
    multi_processor_count=132,
    is_integrated=False,
    L2_cache_size=50 * 2**20,
    warp_size=32,
)


class SimulatedCuda:
    """One run's simulated CUDA on a simulator device (its clock, timing, trace, hardware)."""

    def __init__(self, device: SimDevice, stream_names: Sequence[str] = ()) -> None:
        self.device = device
        device.holds_program_tensors = True  # (the program's tensors: see `Device`)
        self.torch_device = torch.device("cuda", 0)
        self.runtime = StreamRuntime(device, self.torch_device, tuple(stream_names))
        self.memory = Memory()
        self.interceptor = Interceptor(device, self.runtime, self.memory)
        # What stands in while the block lasts, made once: a scheduler enters the block at every
        # iteration, and ~30 context managers an entry were a few per cent of a run.
        interceptor = self.interceptor

        def record_stream(tensor: torch.Tensor, stream: Any) -> None:
            interceptor.record_stream(tensor, stream)

        self._patches: list[tuple[Any, str, Any]] = [
            *((torch.cuda, name, value) for name, value in self._stand_ins().items()),
            (torch.cuda.nvtx, "range", _no_range),
            (torch.cuda.nvtx, "range_push", lambda *args, **kwargs: 0),
            (torch.cuda.nvtx, "range_pop", lambda: 0),
            (torch.cuda.nvtx, "mark", lambda *args, **kwargs: None),
            (torch.Tensor, "record_stream", record_stream),
            (torch.Tensor, "copy_", _copy),
            (torch.Tensor, "tolist", _read_below(torch.Tensor.tolist)),
            (torch.Tensor, "numpy", _read_below(torch.Tensor.numpy)),
        ]
        # (owner, name, what it was) for each attribute set, in the order set; and the mode
        self._undo: list[tuple[Any, str, Any]] | None = None
        self._mode: DispatchMode | None = None

    # -- the block ------------------------------------------------------------------------------

    def __enter__(self) -> SimulatedCuda:
        # Device guards for "cuda" tensors become no-ops on a build without CUDA (as FakeTensor
        # does it); on a CUDA build they guard a real device, which is harmless.
        torch._C._ensureCUDADeviceGuardSet()
        undo: list[tuple[Any, str, Any]] = []
        self._undo = undo
        try:
            for owner, name, value in self._patches:
                _set(owner, name, value, undo)
            # (these wrap what is there at entry)
            _set(torch.Tensor, "to", indexing_to(torch.Tensor.to), undo)
            mode = DispatchMode(self.interceptor)
            mode.__enter__()  # type: ignore[no-untyped-call]
            self._mode = mode
            for factory in ("tensor", "as_tensor"):
                _set(torch, factory, pinning(getattr(torch, factory)), undo)
            _set(torch, "nonzero", nonzero_of(torch.nonzero), undo)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None = None,
        error: BaseException | None = None,
        tb: object = None,
    ) -> None:
        self._leave()
        said = _without_cuda(error)
        if said is not None:
            # torch built without CUDA refused a CUDA API the simulation has no stand-in for:
            # our gap, never the program's crash (a GPU build would have run it)
            raise SimulatedCudaError(
                f"the simulated CUDA has no stand-in for a CUDA API the program called "
                f"({type(error).__name__}: {said}): a gap of overlapcheck's, not a finding"
            ) from error

    def _leave(self) -> None:
        undo, self._undo = self._undo, None
        mode, self._mode = self._mode, None
        if undo is None:
            return
        try:
            # the factories first, then the mode, then the rest: the reverse of the entry
            while undo and undo[-1][0] is torch:
                _restore(*undo.pop())
            if mode is not None:
                mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        finally:
            while undo:
                _restore(*undo.pop())

    def _stand_ins(self) -> dict[str, Any]:
        runtime = self.runtime

        def new_stream(*args: Any, **kwargs: Any) -> SimStream:
            return runtime.new_stream()

        def new_event(*args: Any, **kwargs: Any) -> SimCudaEvent:
            return SimCudaEvent(runtime)

        def stream(s: SimStream | None) -> StreamContext:
            return StreamContext(runtime, s)

        def set_stream(s: SimStream) -> None:
            runtime.current = s

        return {
            "device": _AnyDevice,
            "is_current_stream_capturing": lambda: False,
            "Stream": new_stream,
            "Event": new_event,
            "stream": stream,
            "set_stream": set_stream,
            "current_stream": lambda device=None: runtime.current,
            "default_stream": lambda device=None: runtime.default,
            "synchronize": lambda device=None: runtime.synchronize(),
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "_lazy_init": lambda: None,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda device: None,
            "get_device_name": lambda device=None: "simulated CUDA",
            "mem_get_info": lambda device=None: (FREE_BYTES, FREE_BYTES),
            "get_device_properties": lambda device=None: PROPERTIES,
            "get_device_capability": lambda device=None: (PROPERTIES.major, PROPERTIES.minor),
            "memory_allocated": lambda device=None: 0,
            "max_memory_allocated": lambda device=None: 0,
            "memory_reserved": lambda device=None: 0,
            "empty_cache": lambda: None,
            "reset_peak_memory_stats": lambda device=None: None,
        }

    # -- for the code that stands in for kernels ------------------------------------------------

    def name(self, tensor: torch.Tensor, name: str) -> None:
        """Give a device tensor's buffer a contract name (`token_pool`, `page_table`, `kv`),
        in the ops traced so far too."""
        assert isinstance(tensor, SimTensor)
        old = self.memory.rename(tensor.buffer, name)
        sizes = self.device.trace.sizes
        sizes[tensor.buffer.name] = sizes.pop(old, tensor.buffer.numel)
        for op in self.device.trace.ops:
            for access in op.accesses:
                if access.buffer == old:
                    access.buffer = tensor.buffer.name
        for allocation in self.device.trace.allocations:
            if allocation.buffer == old:
                allocation.buffer = tensor.buffer.name

    def launch(
        self,
        kind: str,
        label: str,
        accesses: Sequence[tuple[torch.Tensor, np.ndarray | None, str]],
        cost: Cost,
        start: Callable[[], Callable[[], None]],
        batch: int | None = None,
        uids: tuple[int, ...] = (),
        unit: Unit | None = None,
        shape: tuple[np.ndarray, np.ndarray] | None = None,
        drafts: np.ndarray | None = None,
    ) -> None:
        """A kernel of the caller's own on the current stream: `accesses` are (tensor, cells of
        its buffer or None for the whole view, "r" | "w"); `start` runs when the kernel starts
        (read the physical copies there) and returns what to run when it ends (write them).
        `shape`: a forward's (slots, context lengths), for a forward whose block table is not
        the contract's token-wide `page_table` (`Op.shape`); `drafts`: how many of each
        sequence's last positions are drafts being verified (`Op.drafts`)."""
        traced = []
        for tensor, cells, mode in accesses:
            found = self.interceptor.locate(tensor)
            assert found is not None, "launch over a tensor the simulation does not know"
            buffer, logical = found
            chosen = view_cells(buffer, logical) if cells is None else cells
            traced.append(Access(buffer.name, chosen, mode))  # type: ignore[arg-type]
        op = self.runtime.op(
            self.runtime.current.name, kind, label=label, accesses=traced, batch=batch, uids=uids
        )
        op.delay = cost.delay
        if shape is not None:
            op.shape = shape
        op.drafts = drafts
        self.interceptor._enqueue(Launch(op, unit or self.device.compute, cost.seconds, start))

    def drain(self) -> None:
        with plain():
            self.runtime.drain()


class StreamContext:
    """`torch.cuda.stream(s)`: makes `s` current inside; reusable, as torch's is (a scheduler may
    keep one and enter it every iteration)."""

    def __init__(self, runtime: StreamRuntime, stream: SimStream | None) -> None:
        self.runtime = runtime
        self.stream = stream
        self._before: list[SimStream] = []

    def __enter__(self) -> None:
        self._before.append(self.runtime.current)
        if self.stream is not None:
            self.runtime.current = self.stream

    def __exit__(self, *exc: object) -> None:
        self.runtime.current = self._before.pop()


_MISSING = object()


def _set(owner: Any, name: str, value: Any, undo: list[tuple[Any, str, Any]]) -> None:
    """`owner.name = value`, noting what was there (a class's own attribute, not an inherited
    one) in `undo`."""
    before = (
        owner.__dict__.get(name, _MISSING)
        if isinstance(owner, type)
        else getattr(owner, name, _MISSING)
    )
    setattr(owner, name, value)
    undo.append((owner, name, before))


def _restore(owner: Any, name: str, before: Any) -> None:
    if before is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, before)


# What torch built without CUDA says when a program calls a CUDA API: the simulation lacks a
# stand-in for it (a GPU build has it).
_NO_CUDA = (
    "compiled without CUDA",
    "not compiled with CUDA",
    "not linked with support for cuda",
    "Tried to instantiate dummy base class",
    "NVTX functions not installed",
    "without ATen_cuda library",
    "has no attribute '_cuda",
    "Cannot access accelerator device when none is available",
)


def _without_cuda(error: BaseException | None) -> str | None:
    """The first line of `error` when torch without CUDA raised it for a CUDA API, else None."""
    if not isinstance(error, RuntimeError | AttributeError) or isinstance(
        error, SimulatedCudaError
    ):
        return None
    text = str(error)
    if not any(marker in text for marker in _NO_CUDA):
        return None
    return text.splitlines()[0]


class _AnyDevice:
    """`torch.cuda.device(i)`: the one simulated device is current whatever `i` says."""

    def __init__(self, device: Any = None) -> None:
        self.idx = 0

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def _no_range(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield


def _copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """`Tensor.copy_` into host memory from a simulated device tensor: the same aten op, without
    the binding's device guard (a build without CUDA has none)."""
    out: torch.Tensor = torch.ops.aten.copy_.default(self, src, non_blocking)
    return out


def _read_below(method: Callable[..., Any]) -> Callable[..., Any]:
    """`tolist()` or `numpy()`, which read memory below the dispatcher, where no mode sees it:
    the `resolve_conj`/`resolve_neg` torch calls through the dispatcher first are the one sign
    of the read (traced as it), and only inference mode lets them reach a mode (elsewhere the
    autograd key resolves them). Run in inference mode, so a read of pinned memory is traced
    under `no_grad` or autograd too."""

    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if torch.is_inference_mode_enabled():
            return method(self, *args, **kwargs)
        with torch.inference_mode():
            return method(self, *args, **kwargs)

    return read
