"""Interception: every aten call of the program, turned into host work or stream work.

An op with no simulated device tensor and no `cuda` device runs on the host at once; if it touches
pinned buffers, its reads and writes are traced on the host. Any other op is stream work on the
stream current at the call: its footprint is traced at issue (`footprint.py`), it runs at once on
the logical copies (program order: shapes, index values, books), and on the physical copies when
the stream reaches it in simulated time: inputs read when it starts, outputs written when it ends.

Copies follow CUDA: a non-blocking copy from or to pinned memory runs on the stream and the host
goes on; from pageable memory the source is staged at the call; a blocking copy, `.item()`, a
truth test of a device value, or an op whose output shape depends on device values waits for the
current stream first (an implicit sync, traced as a host wait).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.torchsim.allocators import DeviceAllocator, HostAllocator
from overlapcheck.backends.torchsim.device_checks import (
    host_generator,
    mixed_devices,
    runs_as_composite,
)
from overlapcheck.backends.torchsim.footprint import Touch, moves, touches
from overlapcheck.backends.torchsim.guards import plain as plain  # (re-exported: its home was here)
from overlapcheck.backends.torchsim.memory import (
    Buffer,
    Geometry,
    Memory,
    at,
    geometry,
    poison,
    same_geometry,
    span,
    view_cells,
)
from overlapcheck.backends.torchsim.schema import OpInfo, op_info
from overlapcheck.backends.torchsim.streams import UNKNOWN, Launch, SimStream, StreamRuntime
from overlapcheck.backends.torchsim.tensor import SimTensor, SimulatedCudaError
from overlapcheck.core.errors import (
    DeviceFault,
    InvariantError,
    OverlapcheckError,
    mark_program_error,
)
from overlapcheck.core.sites import Site, site_of
from overlapcheck.core.trace import Access, Allocation, Op

aten = torch.ops.aten
# `Tensor.copy_` itself, for the simulation's own copies between host tensors: the block patches
# `torch.Tensor.copy_` with a Python stand-in (`session._copy`) that these need not go through.
_copy_into = torch._C.TensorBase.copy_
# A small kernel (elementwise, index, concatenation): about what one takes on a GPU, launch to end.
KERNEL = 4e-6
# Frames of torch and of this package are not the program's.
_SKIP = tuple(
    {str(Path(p).parent) for p in (__file__, torch.__file__)}
    | {str(Path(p).resolve().parent) for p in (__file__, torch.__file__)}
)


_STAND_INS: set[str] = set()  # files of stand-ins for kernels: their callers are the sites


def not_program(path: str) -> None:
    """Frames of the file `path` (a stand-in for a program's kernels) are not the program's:
    what it issues is labelled with its caller's file and line."""
    _STAND_INS.add(path)
    _FILES.clear()


# Each file's `_program_file`, by its name: looked up for every frame of every walk below, a
# dictionary's `get` rather than a cached function's call.
_FILES: dict[str, str | None] = {}
_UNSEEN: Any = object()


def _program_file(path: str) -> str | None:
    """The base name of a file of the program's, or None for torch's and this package's."""
    found = _FILES.get(path, _UNSEEN)
    if found is _UNSEEN:
        found = None
        if not (path.startswith(_SKIP) or path[0] == "<" or path in _STAND_INS):
            found = os.path.basename(path)
        _FILES[path] = found
    return found  # type: ignore[no-any-return]


# A program frame's label part, its function's name, its trace site when it is the scheduler's
# own frame (then it is its own site: `core.sites.site_of` would stop at it; one tuple for
# every op from there), and its code, by the code's identity and the instruction offset (one
# integer): the same few call sites issue every op, `f_lineno` decodes the line table at each
# read, and a code object's hash hashes its constants again at every call (the code kept in
# the entry tells a reused identity apart).
_LABELS: dict[int, tuple[str, str, Site | None, CodeType]] = {}


def _label(frame: FrameType, name: str) -> tuple[str, str, Site | None, CodeType]:
    """`file:line function` for the scheduler's own frame; for an adapter's stand-in (a frame
    of overlapcheck's that the program's calls run through), `file function`: its lines move
    with every edit of ours, and the trace (its digest) must not."""
    code = frame.f_code
    lasti = frame.f_lasti
    key = id(code) << 32 | lasti  # (an offset in a code object's bytecode: under 2**32)
    found = _LABELS.get(key)
    if found is None or found[3] is not code:
        own = site_of(frame) == (code, lasti)
        here = f"{name}:{frame.f_lineno} {code.co_name}" if own else f"{name} {code.co_name}"
        found = _LABELS[key] = (here, code.co_name, (code, lasti) if own else None, code)
    return found


def where() -> tuple[str, str]:
    """The program's innermost frame outside torch and this package: (`file:line function`, the
    function's name), for labels and buffer names."""
    frame: FrameType | None = sys._getframe(1)
    files = _FILES
    while frame is not None:
        path = frame.f_code.co_filename
        name = files.get(path, _UNSEEN)
        if name is _UNSEEN:
            name = _program_file(path)
        if name is not None:
            here, function, _, _ = _label(frame, name)
            return here, function
        frame = frame.f_back
    return "?", "tensor"


def origin() -> tuple[str, str, Site | None]:
    """`where()` and the trace's site of the call (`core.sites.caller`) in one walk: the site is
    found from where's frame on (the frames below it are torch's and this package's, which the
    site's walk skips too)."""
    frame: FrameType | None = sys._getframe(1)
    files = _FILES
    while frame is not None:
        path = frame.f_code.co_filename
        name = files.get(path, _UNSEEN)
        if name is _UNSEEN:
            name = _program_file(path)
        if name is not None:
            here, function, site, _ = _label(frame, name)
            return here, function, site if site is not None else site_of(frame)
        frame = frame.f_back
    return "?", "tensor", None


def _issued_by_program() -> bool:
    """Whether the innermost frame of the program's on the stack is the scheduler's own code
    (not an adapter's stand-in that the program's call runs through)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = _program_file(frame.f_code.co_filename)
        if name is not None:
            return _label(frame, name)[2] is not None
        frame = frame.f_back
    return False


def _fault(op: Op, err: Exception) -> DeviceFault:
    """A stream op that failed when it ran, on what memory held then: the program's crash (it
    succeeded on the values the program wrote in its own order when it was issued)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    where = op.label or op.kind
    return DeviceFault(
        f"`{where}` failed on the device ({op.agent}) with what its memory held when it ran: "
        f"{type(err).__name__}: {text} (on a GPU a device-side fault: `CUDA error` at the next "
        "synchronisation); the same kernel succeeds on the values the program wrote in its "
        "own order, so the memory it read was not yet, or no longer, what the program meant",
        (op,),
        {"type": type(err).__name__, "exception": text, "op": op.seq, "label": where},
    )


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    kind = type(device)
    if kind is torch.device or kind is str:  # (a device's `type` is a new string at each read)
        found = _CUDA.get(device)
        if found is None:
            found = _CUDA[device] = torch.device(device).type == "cuda"
        return found
    return torch.device(device).type == "cuda"


_CUDA: dict[Any, bool] = {}  # `_is_cuda` of each device (and device name) seen


def _leaves(tree: Any) -> list[Any]:
    """The values of an op's arguments (or outputs), one level of lists and tuples down: aten
    arguments nest no deeper (a list of index tensors). Cheaper than a general tree walk, and it
    runs for every op."""
    out: list[Any] = []
    items = tree.values() if isinstance(tree, dict) else tree
    if not isinstance(items, list | tuple | type({}.values())):
        return [tree]
    for x in items:
        if isinstance(x, list | tuple):
            for y in x:
                if isinstance(y, list | tuple | dict):
                    out.extend(_leaves(y))
                else:
                    out.append(y)
        elif isinstance(x, dict):
            out.extend(_leaves(x))
        else:
            out.append(x)
    return out


def _map(
    f: Callable[[Any], Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`f` over an op's argument values, one level of lists and tuples down (see `_leaves`).
    Loops rather than generators: it runs several times for every stream op."""
    out = [type(x)([f(y) for y in x]) if isinstance(x, _SEQUENCES) else f(x) for x in args]
    if not kwargs:
        return tuple(out), {}
    return tuple(out), {
        k: type(v)([f(y) for y in v]) if isinstance(v, _SEQUENCES) else f(v)
        for k, v in kwargs.items()
    }


_SEQUENCES = (list, tuple)
# What `Interceptor._scan` finds besides pinned arguments: stream work; a host op whose pinned
# cells `footprint.touches` finds (an index op, a list of tensors).
_DEVICE = object()
_GENERAL = object()
# What `Interceptor.dispatch` answers for device work by a composite op: the mode runs its parts
DECOMPOSE = object()


def _has_host_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(
        isinstance(x, torch.Tensor) and not isinstance(x, SimTensor)
        for x in _leaves((args, kwargs))
    )


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in _leaves(tree) if isinstance(x, torch.Tensor)]


@dataclass(eq=False, slots=True)
class _Written:
    """An argument an op writes in place: its buffer, the cells written, its start-time clone."""

    buffer: Buffer
    cells: np.ndarray
    clone: torch.Tensor | None = None


@dataclass(eq=False, slots=True)  # (not frozen: that `__init__` goes through object.__setattr__)
class _Ref:
    """A stream op's hold on a tensor argument: its buffer and where in it, not the tensor (the
    program's tensors die when the program drops them, whatever is still queued)."""

    buffer: Buffer
    where: Geometry


@dataclass(eq=False, slots=True)  # (not frozen: that `__init__` goes through object.__setattr__)
class _Held:
    """A stream op's hold on a device tensor argument: its buffer and its view of the buffer's
    physical copy (ours, not the program's tensor, whose death frees the buffer)."""

    buffer: Buffer
    view: torch.Tensor


class Interceptor:
    """The dispatch logic shared by the two modes below."""

    def __init__(self, device: SimDevice, runtime: StreamRuntime, memory: Memory) -> None:
        self.device = device
        self.runtime = runtime
        self.memory = memory
        self.cuda = runtime.torch_device
        self.device_memory = DeviceAllocator(runtime, memory)
        self.host_memory = HostAllocator(runtime, memory)
        runtime.before_wait.append(self.device_memory.collect)
        # by the identity of the overload packet (its hash is a Python method)
        self.handlers: dict[int, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {
            id(packet): handler for packet, handler in self._handlers().items()
        }
        # by the identity of the overload: its info and its handler (None: the general path)
        self._routes: dict[int, tuple[OpInfo, Callable[..., Any] | None]] = {}

    def _handlers(self) -> dict[Any, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]]:
        return {
            aten._local_scalar_dense: self._scalar,
            aten.item: self._scalar,
            aten.is_pinned: self._is_pinned,
            aten.pin_memory: self._pin,
            aten._pin_memory: self._pin,
            aten._to_copy: self._to_copy_op,
            aten.to: self._to,
            aten.copy_: self._copy_op,
            aten.record_stream: lambda func, args, kwargs: self.record_stream(*args[:2]),
        }

    # -- where tensors live ---------------------------------------------------------------------

    def locate(self, t: torch.Tensor) -> tuple[Buffer, torch.Tensor] | None:
        """`t`'s buffer and a tensor with its geometry there (`footprint.Locate`): a pinned
        tensor is its own (the buffer's physical copy is its memory)."""
        if isinstance(t, SimTensor):
            return t.buffer, t.logic
        buffer = self.memory.pinned_of(t)
        if buffer is None:
            return None
        return buffer, t

    def logical(self, x: Any) -> Any:
        if isinstance(x, SimTensor):
            return x.logic
        if isinstance(x, torch.Tensor):
            buffer = self.memory.pinned_of(x)
            if buffer is not None and buffer.logical is not buffer.physical:
                return same_geometry(buffer.logical, x)
            # (pageable; or pinned with its two copies one tensor: `x` is that view of it)
        return x

    def wrap(self, buffer: Buffer, placed: torch.Tensor) -> SimTensor:
        """A new device tensor at `placed`, a view of `buffer`'s logical copy (its own)."""
        return SimTensor(buffer, same_geometry(buffer.physical, placed), placed, self.cuda)

    # -- entry ----------------------------------------------------------------------------------

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """`Tensor.record_stream`: the device allocator holds its block back for `stream`."""
        if isinstance(tensor, SimTensor) and isinstance(stream, SimStream):
            self.device_memory.record_stream(tensor.buffer, stream)

    def fails_alone(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether an op that raised inside the simulation fails by itself: run as torch runs it
        on the program's values (the logical copies, on the host), outside the simulation. Only
        an op the scheduler's own code issued counts (one of an adapter's stand-ins that fails
        there may be a bug of overlapcheck's: that stays ours). The run ends either way."""
        if not _issued_by_program():
            return False
        host_kwargs = dict(kwargs)
        if _is_cuda(host_kwargs.get("device")):
            host_kwargs["device"] = "cpu"
        host_kwargs.pop("pin_memory", None)
        with plain():
            try:
                largs, lkwargs = _map(self.logical, args, host_kwargs)
            except Exception:
                return False  # not even its values could be read: ours
            try:
                func(*largs, **lkwargs)
            except Exception:
                return True
        return False

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.device_memory.dead:  # frees since the last call: a safe point to see them
            self.device_memory.collect()
        route = self._routes.get(id(func))
        if route is None or route[0].func is not func:
            info = op_info(func)
            route = self._routes[id(func)] = (info, self.handlers.get(id(info.packet)))
        info, handler = route
        if handler is not None:
            return handler(func, args, kwargs)
        found = self._scan(info, args, kwargs)
        if found is _DEVICE:
            if info.view:
                return self._view(func, args, kwargs)
            if info.composite:
                return DECOMPOSE
            if (
                info.explicit is not None
                and _has_host_tensor(args, kwargs)
                and runs_as_composite(func)
            ):
                return DECOMPOSE  # its parts refuse what a GPU would
            return self._kernel(func, args, kwargs)
        return self._run_host(info, args, kwargs, found)

    def _scan(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One pass over an op's arguments (one level of lists down): `_DEVICE` when it is stream
        work (a simulated device tensor among them, or a `cuda` device); else what the host op
        traces: None (no pinned memory), `_GENERAL` (an index op with pinned memory about:
        `footprint.touches` finds the cells its indices pick), or its pinned tensors, as
        (position or name, None in a list; buffer; tensor; written), in argument order (the
        order `footprint.touches` finds them in)."""
        # (an op that reads no values of its arguments, a view say, touches no pinned cell)
        pinned = self.memory.pinned if info.reads else None
        found: list[tuple[int | str | None, Buffer, torch.Tensor, bool]] = []
        written = info.written
        for i, x in enumerate(args):
            if isinstance(x, torch.Tensor):
                if isinstance(x, SimTensor):
                    return _DEVICE
                if pinned and x.is_cpu and i < len(written):
                    buffer = pinned.get(x.untyped_storage().data_ptr())
                    if buffer is not None:
                        found.append((i, buffer, x, written[i]))
            elif isinstance(x, _SEQUENCES):
                for y in x:
                    if isinstance(y, torch.Tensor):
                        if isinstance(y, SimTensor):
                            return _DEVICE
                        if pinned and y.is_cpu and i < len(written):
                            buffer = pinned.get(y.untyped_storage().data_ptr())
                            if buffer is not None:
                                found.append((None, buffer, y, written[i]))
        if kwargs:
            if _is_cuda(kwargs.get("device")):
                return _DEVICE
            by_name = info.by_name
            for name, x in kwargs.items():
                if isinstance(x, torch.Tensor):
                    if isinstance(x, SimTensor):
                        return _DEVICE
                    known = by_name.get(name)
                    if pinned and x.is_cpu and known is not None:
                        buffer = pinned.get(x.untyped_storage().data_ptr())
                        if buffer is not None:
                            found.append((name, buffer, x, known[1]))
                elif isinstance(x, _SEQUENCES):
                    known = by_name.get(name)
                    for y in x:
                        if isinstance(y, torch.Tensor):
                            if isinstance(y, SimTensor):
                                return _DEVICE
                            if pinned and y.is_cpu and known is not None:
                                buffer = pinned.get(y.untyped_storage().data_ptr())
                                if buffer is not None:
                                    found.append((None, buffer, y, known[1]))
        if not pinned:
            return None
        if info.indexed:
            return _GENERAL
        return found or None

    def _allocated(
        self, buffer: Buffer, like: torch.Tensor, here: str, what: str, site: Site | None
    ) -> np.ndarray:
        """A new tensor got `like`'s cells of `buffer` (fresh or reused): never written since.
        Returns those cells."""
        trace = self.device.trace
        cells = view_cells(buffer, like)
        trace.allocations.append(
            Allocation(
                len(trace.ops), self.device.recorder.step, buffer.name, cells, here, what, site
            )
        )
        return cells

    # -- host work ------------------------------------------------------------------------------

    def _host(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], info: OpInfo | None = None
    ) -> Any:
        """`func` on host tensors, at once (its reads and writes of pinned memory traced)."""
        if info is None:
            info = op_info(func)
        found = self._scan(info, args, kwargs)
        if found is _DEVICE:  # (a handler's host op: no simulated tensor, but a device named)
            found = _GENERAL if self.memory.pinned and info.reads else None
        return self._run_host(info, args, kwargs, found)

    def _run_host(
        self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], found: Any
    ) -> Any:
        """A host op, with what `_scan` found of its pinned arguments."""
        pin = False
        if kwargs:
            pin = kwargs.get("pin_memory") is True
            if pin:
                kwargs = {**kwargs, "pin_memory": False}
        accesses: list[Access] | None = None
        writes = False
        if found is _GENERAL:
            memory = self.memory
            if memory.any_pinned(args) or (kwargs and memory.any_pinned(kwargs.values())):
                touched = touches(info.func, args, kwargs, self.locate, self.logical)
                if touched:
                    accesses = [Access(t.buffer.name, t.cells, t.mode) for t in touched]  # type: ignore[arg-type]
                    writes = any(t.mode == "w" for t in touched)
            found = None
        elif found is not None:
            # the reads first, then the writes, each in argument order
            accesses = []
            one = True  # every buffer's two copies still one tensor
            for _, buffer, x, w in found:
                if buffer.logical is not buffer.physical:
                    one = False
                if w:
                    writes = True
                else:
                    accesses.append(Access(buffer.name, view_cells(buffer, x), "r"))
            if writes:
                for _, buffer, x, w in found:
                    if w:
                        accesses.append(Access(buffer.name, view_cells(buffer, x), "w"))
                if one:
                    writes = False  # (written once, by the op itself)
        if writes:
            # Pinned buffers whose copies are still one tensor are written once, by the op; if
            # any it touches has a logical copy of its own, the op runs again on the logical
            # copies, into logical copies of their own.
            writes = self._twin_needed(args, kwargs, found)
        out = info.call(*args, **kwargs)
        if info.empty and isinstance(out, torch.Tensor):
            out.fill_(poison(out.dtype))
        if pin and isinstance(out, torch.Tensor):
            _, hint, pin_site = origin()
            out = self._pinned(out, hint, pin_site)
        if accesses is not None:
            here, _, site = origin()
            self.device.recorder.host_op(
                float(self.runtime.env.now), site, f"{info.name} @{here}", accesses
            )
            if writes:  # keep the logical twins in step
                listed = found is None or any(key is None for key, _, _, _ in found)
                self._host_twin(info, args, kwargs, None if listed else found)
        return out

    def _twin_needed(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        pinned: list[tuple[int | str | None, Buffer, torch.Tensor, bool]] | None,
    ) -> bool:
        """Whether a host op that writes pinned memory must run again on the logical copies:
        when a pinned buffer among its arguments (`pinned`, as `_scan` found them; None: looked
        up one level of lists down) has a logical copy of its own. Then the buffers it writes
        get theirs too, before it runs (it computes their logical copies from the others')."""
        if pinned is None:
            buffers: list[tuple[Buffer, bool]] = []
            pinned_of = self.memory.pinned_of
            for x in _leaves((args, kwargs)):
                if isinstance(x, torch.Tensor):
                    buffer = pinned_of(x)
                    if buffer is not None:
                        buffers.append((buffer, True))  # (written or not: split them all)
        else:
            buffers = [(buffer, written) for _, buffer, _, written in pinned]
        if all(buffer.logical is buffer.physical for buffer, _ in buffers):
            return False
        for buffer, written in buffers:
            if written:
                buffer.split()
        return True

    def _host_twin(
        self,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        pinned: list[tuple[int | str | None, Buffer, torch.Tensor, bool]] | None,
    ) -> None:
        """A host op that wrote pinned memory, again on the logical copies: each pinned argument
        (`pinned`: by position or name, as `_scan` found them; None: look them up, one level of
        lists down) as the same view of its buffer's logical copy."""
        if pinned is not None:
            largs = list(args)
            lkwargs = kwargs
            for key, buffer, x, _ in pinned:
                view = buffer.logical.as_strided(x.size(), x.stride(), x.storage_offset())
                if key is None:
                    raise AssertionError("a pinned tensor in a list is looked up again")
                if isinstance(key, int):
                    largs[key] = view
                else:
                    if lkwargs is kwargs:
                        lkwargs = dict(kwargs)
                    lkwargs[key] = view
            info.call(*largs, **lkwargs)
            return
        pinned_of = self.memory.pinned

        def swap(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                buffer = pinned_of.get(x.untyped_storage().data_ptr()) if x.is_cpu else None
                if buffer is not None:
                    return buffer.logical.as_strided(x.size(), x.stride(), x.storage_offset())
            elif isinstance(x, _SEQUENCES):
                return type(x)(swap(y) for y in x)
            return x

        info.call(*[swap(x) for x in args], **{k: swap(v) for k, v in kwargs.items()})

    def _host_op(self, label: str, accesses: list[Access], site: Site | None) -> Op:
        return self.device.recorder.host_op(float(self.runtime.env.now), site, label, accesses)

    def _pinned(self, made: torch.Tensor, hint: str, site: Any = UNKNOWN) -> torch.Tensor:
        """`made` copied into pinned memory (`HostAllocator.allocate`; `site`: the call's, when
        known), its buffer's size declared in the trace as a device buffer's is (the race
        checker's shadow region for it is then made once, not grown to the largest cell seen at
        every access)."""
        tensor = self.host_memory.allocate(made, hint, site)
        buffer = self.memory.pinned_of(tensor)
        if buffer is not None:
            self.device.trace.sizes.setdefault(buffer.name, buffer.numel)
        return tensor

    def _is_pinned(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        t = args[0]
        return not isinstance(t, SimTensor) and self.memory.pinned_of(t) is not None

    def _pin(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        t: torch.Tensor = args[0]
        if isinstance(t, SimTensor):
            raise RuntimeError(
                "cannot pin 'torch.cuda.IntTensor' only dense CPU tensors can be pinned"
            )
        located = self.memory.pinned_of(t) is not None
        if located and func.overloadpacket is aten.pin_memory:
            return t  # already pinned: itself, as PyTorch's `pin_memory` (`_pin_memory` copies)
        # (a fresh pageable tensor, as `torch.tensor(..., pin_memory=True)` makes, reads nothing
        # traced: `touches` would find nothing)
        found = touches(aten.clone.default, (t,), {}, self.locate, self.logical) if located else []
        here, hint, site = origin()
        fresh = (  # a tensor that is its whole storage: the allocator copies it, and keeps none
            not located
            and t.storage_offset() == 0
            and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        )
        copy = self._pinned(t if fresh else t.clone(), hint, site)
        if found:
            accesses = [Access(t.buffer.name, t.cells, t.mode) for t in found]  # type: ignore[arg-type]
            self._host_op(f"pin_memory @{here}", accesses, site)
        return copy

    def _scalar(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`.item()`: of a device value, an implicit sync on the current stream first."""
        t = args[0]
        if not isinstance(t, SimTensor):
            return self._host(func, args, kwargs)
        return self._read_to_host(func, args, kwargs, f"{func.overloadpacket.__name__}")

    def _read_to_host(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
    ) -> Any:
        """A host value computed from device values: the current stream copies them out, the host
        waits for it, then computes from what the copy read."""
        found = touches(func, args, kwargs, self.locate, self.logical)
        here, _, site = origin()
        runtime = self.runtime
        stream = runtime.current
        op = runtime.op_at(
            stream.name,
            "d2h",
            site,
            label=f"{what} @{here}",
            accesses=[Access(t.buffer.name, t.cells, t.mode) for t in found],  # type: ignore[arg-type]
        )
        seen: list[Any] = []
        duration, op.delay = self.device.timing.d2h()
        pargs, pkwargs = _map(_physical, args, kwargs)

        def start() -> Callable[[], None]:
            seen.append(func(*pargs, **pkwargs))  # (in simulated time: under `plain` already)
            return lambda: None

        self._enqueue(Launch(op, self.device.d2h_engine, duration, start))
        runtime.sync_current(f"{what} (implicit sync)")
        return seen[0]

    # -- views ----------------------------------------------------------------------------------

    def _view(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        first = args[0] if args else None  # (a view's source is its first argument)
        source = (
            first
            if isinstance(first, SimTensor)
            else next(x for x in _leaves((args, kwargs)) if isinstance(x, SimTensor))
        )
        call = op_info(func).call
        largs, lkwargs = _map(self.logical, args, kwargs)
        lout = call(*largs, **lkwargs)
        buffer = source.buffer
        ptr = buffer.logical.untyped_storage().data_ptr()
        physical = buffer.physical
        if isinstance(lout, torch.Tensor):
            if lout.untyped_storage().data_ptr() != ptr:
                return self._kernel(func, args, kwargs)  # a copy after all (see below)
            if lout.dtype == physical.dtype:
                # the same view of the physical copy (the source's two views share a geometry)
                return SimTensor(buffer, same_geometry(physical, lout), lout, self.cuda)
        elif not all(t.untyped_storage().data_ptr() == ptr for t in _tensors(lout)):
            return self._kernel(func, args, kwargs)  # a copy after all (reshape of a strided view)
        pargs, pkwargs = _map(_physical, args, kwargs)
        pout = call(*pargs, **pkwargs)

        def wrap(p: Any, lg: Any) -> Any:
            if isinstance(p, torch.Tensor):
                return SimTensor(buffer, p, lg, self.cuda)
            return p

        if isinstance(pout, torch.Tensor):
            return wrap(pout, lout)
        return type(pout)(wrap(p, lg) for p, lg in zip(pout, lout, strict=True))

    # -- stream work ----------------------------------------------------------------------------

    def _kernel(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        kind: str = "kernel",
        out_device: str = "cuda",
    ) -> Any:
        runtime = self.runtime
        info = op_info(func)
        host_kwargs = kwargs
        if kwargs:
            host_kwargs = dict(kwargs)
            if _is_cuda(host_kwargs.get("device")):
                host_kwargs["device"] = "cpu"
            host_kwargs.pop("pin_memory", None)
        # What the op holds until it runs: its buffers and where in them (not the program's
        # tensors: a device tensor's view of its physical copy, a pinned one's geometry), and
        # pageable host sources staged now, at the call (one copy per tensor; streams write no
        # pageable memory after a call returns). The host tensors, in order.
        pinned_of = self.memory.pinned_of
        staged: dict[int, torch.Tensor] = {}
        hosts: list[torch.Tensor] = []

        def hold(x: Any) -> Any:
            if isinstance(x, SimTensor):
                return _Held(x.buffer, x.phys)
            if isinstance(x, torch.Tensor):
                hosts.append(x)
                buffer = pinned_of(x)
                if buffer is not None:
                    return _Ref(buffer, geometry(x))
                copy = staged.get(id(x))
                if copy is None:
                    copy = staged[id(x)] = x.clone()
                return copy
            return x

        held_args, held_kwargs = _map(hold, args, host_kwargs)
        if hosts:  # a host tensor among device work: fine for some ops, an error for others
            _refuse(mixed_devices(func, args, kwargs) or _host_operand(info, args, kwargs))
        if info.generator is not None:
            _refuse(host_generator(func, info.generator, args, kwargs))
        fixed = not (info.dynamic and _data_dependent(func, args))  # its output shapes
        if not fixed:
            runtime.sync_current(f"{info.name} (data-dependent shape)")
        reading = (args[1:], kwargs) if info.like else (args, kwargs)
        found = touches(func, reading[0], reading[1], self.locate, self.logical)
        if info.like:
            found = [t for t in found if t.mode == "w"]
        for t in found:  # pinned memory it writes: the logical copy now, the physical one later
            if t.mode == "w" and t.buffer.pinned:
                t.buffer.split()
        largs, lkwargs = _map(self.logical, args, host_kwargs)
        lout = info.call(*largs, **lkwargs)
        if info.empty and isinstance(lout, torch.Tensor):
            lout.fill_(poison(lout.dtype))  # undefined, but the same in every process
        if not isinstance(lout, torch.Tensor) and not _tensors(lout) and lout is not None:
            return self._read_to_host(func, args, kwargs, info.name)  # a host value
        aliases = info.aliases
        fresh: list[tuple[Buffer, torch.Tensor, np.ndarray]] = []  # each new output's
        here, name_hint, site = origin()

        def result(value: Any, alias: int | None) -> Any:
            if alias is not None:
                return _arg(func, args, kwargs, alias)
            if not isinstance(value, torch.Tensor):
                return value
            if out_device == "cuda":
                buffer, placed = self.device_memory.allocate(value, name_hint, site)
                self.device.trace.sizes[buffer.name] = buffer.numel
                _copy_into(placed, value)
                cells = self._allocated(buffer, placed, here, info.name, site)
                fresh.append((buffer, placed, cells))
                return self.wrap(buffer, placed)
            raise SimulatedCudaError(f"{func}: an output on {out_device}")

        returns = (lout,) if isinstance(lout, torch.Tensor) or len(aliases) <= 1 else tuple(lout)
        if len(aliases) <= 1:
            made = result(lout, aliases[0] if aliases else None)
        else:
            made = type(lout)(result(v, a) for v, a in zip(returns, aliases, strict=False))
        prior = len(found)
        for buffer, _, cells in fresh:
            found.append(Touch(buffer, cells, "w"))
        if info.empty:
            return made  # no kernel: the memory is allocated, its contents undefined
        # What the kernel writes, restored from its start-time clone at its end; a fresh output
        # whose shape the inputs' shapes fix is left out: written whole at the end anyway.
        written = _written(found if not fixed else found[:prior])
        op = runtime.op_at(
            runtime.current.name,
            kind,
            site,
            label=f"{info.name} @{here}",
            accesses=[Access(t.buffer.name, t.cells, t.mode) for t in found],  # type: ignore[arg-type]
        )
        op.moves = moves(func, found)
        timing = self.device.timing
        duration, op.delay = timing.cost("kernel", KERNEL)
        targets = [(buffer.physical, placed) for buffer, placed, _ in fresh]

        call = info.call

        def start() -> Callable[[], None]:  # (in simulated time: under `plain` already)
            for w in written.values():
                w.clone = w.buffer.physical.clone()

            def phys(x: Any) -> Any:
                if isinstance(x, _Held):
                    w = written.get(id(x.buffer))
                    if w is None or w.clone is None:
                        return x.view
                    return same_geometry(w.clone, x.view)
                if isinstance(x, _Ref):
                    w = written.get(id(x.buffer))
                    base = w.clone if w is not None and w.clone is not None else None
                    return at(x.buffer.physical if base is None else base, x.where)
                return x

            pargs, pkwargs = _map(phys, held_args, held_kwargs)
            try:
                pout = call(*pargs, **pkwargs)
            except Exception as err:  # (it ran on the program's values when issued)
                raise _fault(op, err) from err

            def end() -> None:
                for w in written.values():
                    assert w.clone is not None
                    n = len(w.cells)
                    first = int(w.cells[0]) if n else 0
                    if n and w.cells is span(first, n):  # (a view's cells: a slice's copy)
                        _copy_into(
                            w.buffer.physical.narrow(0, first, n), w.clone.narrow(0, first, n)
                        )
                    else:  # (flat copies: `take` and `put_` index them as they are)
                        cells = torch.from_numpy(w.cells)
                        w.buffer.physical.put_(cells, w.clone.take(cells))
                if not targets:
                    return
                fresh_outs = [
                    o
                    for o, a in zip(_as_list(pout), aliases or (None,), strict=False)
                    if a is None and isinstance(o, torch.Tensor)
                ]
                for (physical, placed), value in zip(targets, fresh_outs, strict=False):
                    target = same_geometry(physical, placed)
                    if target.shape == value.shape:
                        _copy_into(target, value)

            return end

        self._enqueue(Launch(op, self.device.compute, duration, start))
        self.host_memory.copied([t.buffer for t in found if t.buffer.pinned], runtime.current, site)
        return made

    def _enqueue(self, launch: Launch) -> None:
        """Queue `launch` on the current stream."""
        self.runtime.current.enqueue(launch)

    # -- copies ---------------------------------------------------------------------------------

    def _to(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`Tensor.to(...)`: itself when nothing changes, else a copy (`_to_copy`)."""
        if len(args) == 1:  # (`to.dtype_layout`, what `Tensor.to` mostly is: the rest by name)
            x = args[0]
            get = kwargs.get
            other, device, dtype = get("other"), get("device"), get("dtype")
            copy, non_blocking = get("copy", False), get("non_blocking", False)
        else:
            info = op_info(func)
            by_name = dict(zip(info.names, args, strict=False))  # (the schema names them all)
            if kwargs:
                known = info.by_name
                by_name.update((k, v) for k, v in kwargs.items() if k in known)
            x = by_name.pop("self")
            other = by_name.pop("other", None)
            device, dtype = by_name.get("device"), by_name.get("dtype")
            copy, non_blocking = by_name.get("copy", False), by_name.get("non_blocking", False)
        if isinstance(other, torch.Tensor):
            device, dtype = other.device, other.dtype
        if device is None:
            target_device = x.device
        else:
            target_device = device if isinstance(device, torch.device) else torch.device(device)
        if target_device.type == "cuda":
            target_device = self.cuda
        target_dtype = dtype if dtype is not None else x.dtype
        same = target_device.type == x.device.type and target_dtype == x.dtype
        if same and not copy:
            return x
        return self._to_copy(x, target_dtype, target_device, bool(non_blocking))

    def _to_copy_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = args[0]
        device = kwargs.get("device")
        target = torch.device(device) if device is not None else x.device
        dtype = kwargs.get("dtype") or x.dtype
        if kwargs.get("pin_memory") and target.type == "cpu" and not isinstance(x, SimTensor):
            out = self._host(func, args, kwargs)
            return out
        return self._to_copy(x, dtype, target, bool(kwargs.get("non_blocking", False)))

    def _to_copy(
        self, x: torch.Tensor, dtype: torch.dtype, target: torch.device, non_blocking: bool
    ) -> Any:
        cuda_src, cuda_dst = isinstance(x, SimTensor), target.type == "cuda"
        if not cuda_src and not cuda_dst:
            return self._host(aten._to_copy.default, (x,), {"dtype": dtype})
        if cuda_src and cuda_dst:
            return self._kernel(aten._to_copy.default, (x,), {"dtype": dtype}, kind="kernel")
        here, hint, site = origin()
        if cuda_dst:  # host to device into a fresh buffer
            src_buffer = self.memory.pinned_of(x)
            logical = x  # (`logical(x)`, with the buffer looked up once for `_h2d` too)
            if src_buffer is not None and src_buffer.logical is not src_buffer.physical:
                logical = same_geometry(src_buffer.logical, x)
            if logical.dtype != dtype:
                logical = logical.to(dtype)
            buffer, placed = self.device_memory.allocate(logical, hint, site)
            self.device.trace.sizes[buffer.name] = buffer.numel
            _copy_into(placed, logical)
            out = self.wrap(buffer, placed)
            self._allocated(buffer, placed, here, "to", site)
            self._h2d(out, x, non_blocking, here, site, src_buffer)
            return out
        # device to host: pinned when non-blocking (as PyTorch's `_to_copy` does)
        assert isinstance(x, SimTensor)
        with plain():
            host = torch.full(x.shape, poison(dtype), dtype=dtype)
        if non_blocking:
            host = self._pinned(host, hint, site)
        self._d2h(host, x, non_blocking, here, site)
        return host

    def _copy_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dst, src = args[0], args[1]
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        if isinstance(dst, SimTensor) and isinstance(src, SimTensor):
            return self._kernel(func, args, kwargs, kind="kernel")
        here, _, site = origin()
        if isinstance(dst, SimTensor):
            self._h2d(dst, src, non_blocking, here, site)
            return dst
        if isinstance(src, SimTensor):
            self._d2h(dst, src, non_blocking, here, site)
            return dst
        return self._host(func, args, kwargs)

    def _h2d(
        self,
        dst: SimTensor,
        src: torch.Tensor,
        non_blocking: bool,
        here: str,
        site: Site | None,
        fresh: Any = _UNSEEN,
    ) -> None:
        """A copy from host memory into `dst`. `fresh`: the source's pinned buffer (None:
        pageable), where `dst` is a fresh tensor `_to_copy` made, whose logical copy already
        holds the values."""
        runtime = self.runtime
        src_buffer = self.memory.pinned_of(src) if fresh is _UNSEEN else fresh
        asynchronous = non_blocking and src_buffer is not None
        # what the copy reads when it starts: the pinned source then (held by its buffer, not
        # by the program's tensor), or pageable memory staged now
        source: _Ref | torch.Tensor
        if fresh is _UNSEEN:
            with plain():
                _copy_into(same_geometry(dst.buffer.logical, dst.logic), self.logical(src))
        written = Access(dst.buffer.name, view_cells(dst.buffer, dst.logic), "w")
        if asynchronous and src_buffer is not None:
            source = _Ref(src_buffer, geometry(src))
            accesses = [Access(src_buffer.name, view_cells(src_buffer, src), "r"), written]
        else:
            with plain():
                source = src.clone()
            accesses = [written]
        op = runtime.op_at(
            runtime.current.name, "h2d", site, label=f"h2d @{here}", accesses=accesses
        )
        timing = self.device.timing
        duration, op.delay = timing.h2d(dst.numel())
        target = dst.phys

        def start() -> Callable[[], None]:  # (in simulated time: under `plain` already)
            value = (
                at(source.buffer.physical, source.where) if isinstance(source, _Ref) else source
            ).clone()

            def end() -> None:
                _copy_into(target, value)

            return end

        self._enqueue(Launch(op, self.device.h2d_engine, duration, start))
        if isinstance(source, _Ref):
            self.host_memory.copied([source.buffer], runtime.current, site)
        if not non_blocking:
            runtime.sync_current("blocking h2d")

    def _d2h(
        self, dst: torch.Tensor, src: SimTensor, non_blocking: bool, here: str, site: Site | None
    ) -> None:
        runtime = self.runtime
        dst_buffer = self.memory.pinned_of(dst)
        asynchronous = non_blocking and dst_buffer is not None
        found = [Touch(src.buffer, view_cells(src.buffer, src.logic), "r")]
        if dst_buffer is not None:
            found.append(Touch(dst_buffer, view_cells(dst_buffer, dst), "w"))
            dst_buffer.split()  # the logical copy now, the physical one when the copy runs
            with plain():
                _copy_into(same_geometry(dst_buffer.logical, dst), src.logic)
        op = runtime.op_at(
            runtime.current.name,
            "d2h",
            site,
            label=f"d2h @{here}",
            accesses=[Access(t.buffer.name, t.cells, t.mode) for t in found],  # type: ignore[arg-type]
        )
        timing = self.device.timing
        duration, op.delay = timing.d2h()
        source, dst_dtype = src.phys, dst.dtype
        target = _Ref(dst_buffer, geometry(dst)) if dst_buffer is not None else None
        pageable = dst if target is None else None  # the host waits for it below

        def start() -> Callable[[], None]:  # (in simulated time: under `plain` already)
            value = source.to(dst_dtype)

            def end() -> None:
                if target is not None:
                    _copy_into(at(target.buffer.physical, target.where), value)
                elif pageable is not None:
                    _copy_into(pageable, value)

            return end

        self._enqueue(Launch(op, self.device.d2h_engine, duration, start))
        if asynchronous and dst_buffer is not None:
            self.host_memory.copied([dst_buffer], runtime.current, site)
        if not asynchronous:
            runtime.sync_current("blocking d2h")


def _data_dependent(func: Any, args: tuple[Any, ...]) -> bool:
    """Whether the output's shape depends on device values (an index op only by a mask)."""
    if func.overloadpacket is aten.index and len(args) > 1:
        masks = (torch.bool, torch.uint8)
        return any(isinstance(i, torch.Tensor) and i.dtype in masks for i in args[1])
    return True


def _host_operand(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """TensorIterator's pointwise ops and `cat` refuse a host tensor of one or more dimensions
    among device tensors (a 0-dim one is a scalar, allowed): CUDA's message, else None."""
    if not info.one_device:
        return None
    for x in _leaves((args, kwargs)):
        if isinstance(x, torch.Tensor) and not isinstance(x, SimTensor) and x.dim() > 0:
            return (
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, cuda:0 and cpu! (`{info.name}` of a host tensor of shape "
                f"{list(x.shape)} with device tensors)"
            )
    return None


def _refuse(message: str | None) -> None:
    """Raise CUDA's error where a GPU refuses what the host, where the simulation computes,
    would run (`device_checks`). The program's error where the scheduler's own code issued the
    op."""
    if message is None:
        return
    err = RuntimeError(message)
    if _issued_by_program():
        mark_program_error(err)
    raise err


def _physical(x: Any) -> Any:
    return x.phys if isinstance(x, SimTensor) else x


def _as_list(value: Any) -> list[Any]:
    if value is None:  # an op that returns nothing (`_foreach_*_`, `record_stream`)
        return []
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _arg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> Any:
    if index < len(args):
        return args[index]
    return kwargs[op_info(func).names[index]]


def _written(found: list[Touch]) -> dict[int, _Written]:
    out: dict[int, _Written] = {}
    for t in found:
        if t.mode != "w":
            continue
        w = out.get(id(t.buffer))
        if w is None:
            out[id(t.buffer)] = _Written(t.buffer, t.cells)
        else:
            w.cells = np.concatenate([w.cells, t.cells])
    return out


class DispatchMode(TorchDispatchMode):
    """Every aten call of the program, to the interceptor."""

    def __init__(self, interceptor: Interceptor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.interceptor = interceptor

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's dispatch in `torch._dynamo.disable` (a frame-evaluation swap at
        # every aten call) unless this says no: nothing here is ever compiled.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        try:
            out = self.interceptor.dispatch(func, args, kwargs or {})
            if out is DECOMPOSE:
                # A composite: its parts through the mode, as a GPU runs them, each a kernel
                # with its own checks, syncs and footprint (inference mode skips the autograd
                # key that splits an implicit one before this mode; an explicit one is split
                # only where a host tensor is among its device tensors, for its parts' checks).
                info = op_info(func)
                with self:
                    if info.composite:
                        return func.decompose(*args, **(kwargs or {}))
                    return func._op_dk(info.explicit, *args, **(kwargs or {}))
            return out
        except (OverlapcheckError, InvariantError):
            raise
        except Exception as err:
            if self.interceptor.fails_alone(func, args, kwargs or {}):
                mark_program_error(err)
            raise


_AS_TENSOR = torch.as_tensor


def pinning(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`torch.tensor(..., pin_memory=True)` (or `as_tensor`) builds its tensor below the
    dispatcher, where no mode sees the pinning: build it unpinned, then pin it through the
    dispatcher. A stand-in for the factory while the block lasts, rather than a function mode,
    which would cost every torch call of the program a Python call. One made on the device is
    built on the host and copied (a blocking copy from pageable memory, as the factory does).
    `as_tensor` of a tensor is that tensor where its device and dtype fit, as in PyTorch."""
    as_tensor = factory is _AS_TENSOR

    def made(*args: Any, **kwargs: Any) -> torch.Tensor:
        data = args[0] if args else kwargs.get("data")
        if as_tensor and isinstance(data, torch.Tensor) and len(args) <= 1:
            # a tensor already: itself where its device and dtype fit, as PyTorch's
            device = kwargs.get("device")
            return data.to(
                device=data.device if device is None else indexed(device),
                dtype=kwargs.get("dtype") or data.dtype,
            )
        if kwargs.get("pin_memory") is True:
            return _built(factory, data, args, {**kwargs, "pin_memory": False}).pin_memory()
        device = kwargs.get("device")
        if _is_cuda(device):  # built on the host, then copied through the dispatcher
            return _built(factory, data, args, {**kwargs, "device": "cpu"}).to(indexed(device))
        return factory(*args, **kwargs)

    return made


_NUMBERS = (int, float, bool)


def _built(
    factory: Callable[..., torch.Tensor], data: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor:
    """A host tensor the factory builds for the simulation to pin or copy at once. From a flat
    list of Python numbers on the host, with no torch function mode about and the simulation's
    mode the only dispatch mode, below that mode: its only aten calls are `lift_fresh` and
    `detach_` of the fresh tensor, which trace nothing (a list holding tensors reads them
    through the dispatcher: not so)."""
    if (
        type(data) in _SEQUENCES
        and _dispatch_modes() == 1
        and not _function_modes()
        and not _is_cuda(kwargs.get("device"))
        and all(type(x) in _NUMBERS for x in data)
    ):
        mode = _pop_mode(None)
        try:
            return factory(*args, **kwargs)
        finally:
            _push_mode(mode)
    return factory(*args, **kwargs)


_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_pop_mode = torch._C._pop_torch_dispatch_stack
_push_mode = torch._C._push_on_torch_dispatch_stack


CUDA0 = torch.device("cuda", 0)
_BARE_CUDA = torch.device("cuda")


def indexed(device: Any) -> Any:
    """A device without an index ("cuda"), as the simulated device's ("cuda:0"): torch's argument
    parser asks the CUDA runtime for the current index of a bare "cuda", which a build without
    CUDA does not have; anything else as it is."""
    if device == "cuda" or (isinstance(device, torch.device) and device == _BARE_CUDA):
        return CUDA0
    return device


def indexing_to(to: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`Tensor.to` with a bare "cuda" device made "cuda:0" (`indexed`)."""

    def moved(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            args = (indexed(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = indexed(kwargs["device"])
        return to(self, *args, **kwargs)

    return moved
