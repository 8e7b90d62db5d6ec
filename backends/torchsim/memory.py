"""Device and pinned host buffers of the simulated CUDA.

Every buffer is a flat CPU tensor twice over:

* `physical`: what the simulated device (or the pinned host page) holds now, in simulated time. A
  stream op writes it when the op ends; the host reads it whenever it reads.
* `logical`: the values in program order, as if each op had run when the host issued it. Shapes,
  the cells an index op touches, and the books of a scheduler are read from it: it is what the
  program means, where `physical` is what the hardware did (the two differ only after a race).

A pinned buffer's two copies are one tensor until a stream op is issued that writes it (a copy
to the host, a kernel): the host's own ops write both copies at once, so until then they cannot
differ, and a host op on them needs no second run on the logical copy (`Buffer.split`).

A buffer is memory of PyTorch's caching allocators (`allocators.py`): freed, it may be handed to a
later allocation of the same dtype, which then uses the same cells under the same name (a twin
buffer: the same copies, its own holders), so the race checker sees a use of the old tensor and a
use of the new one as two accesses of one buffer; handed to another dtype, it is a new buffer
whose cells the trace maps to the old ones (`Reuse.source`). Names are given in allocation order,
so the same program names its buffers the same way in any process.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
import torch

HOST_PREFIX = "host:"
# `Tensor.numpy` itself, for the simulation's own cell numbers: inside the block it is a Python
# stand-in (`session._read_below`) that traces a program's reads of pinned memory.
as_numpy = torch._C.TensorBase.numpy
# A view's sizes, strides and storage offset: what a stream op keeps of a tensor it will run on,
# so that it holds its buffer but none of the program's tensors (their lifetimes are the frees).
Geometry = tuple[tuple[int, ...], tuple[int, ...], int]


@cache  # (by dtype: it is asked at every allocation and every `empty`)
def poison(dtype: torch.dtype) -> float | int | bool:
    """What uninitialised memory holds here: deterministic, and never a plausible token id."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return -1 if dtype.is_signed else torch.iinfo(dtype).max


@dataclass(eq=False)
class Buffer:
    """One allocation: its trace name, whether it is pinned host memory, and its two copies."""

    name: str
    pinned: bool
    physical: torch.Tensor  # flat, `numel` elements
    logical: torch.Tensor  # flat, same dtype and size
    _ids: torch.Tensor | None = field(default=None, repr=False)
    # Device buffers: the program's live tensors on it (weak), and what to call when the last
    # one dies (its allocator's free).
    holders: set[weakref.ref[torch.Tensor]] = field(default_factory=set, repr=False)
    on_free: Callable[[Buffer], None] | None = field(default=None, repr=False)
    # A twin (a later tensor in this memory, same dtype: `allocators.py`): the buffer whose
    # name, cells and copies it shares; its own `holders` are that tensor's.
    origin: Buffer | None = field(default=None, repr=False)

    def hold(self, tensor: torch.Tensor) -> None:
        """`tensor` (a view of this buffer the program holds) keeps it allocated while it lives."""
        if self.on_free is not None:
            self.holders.add(weakref.ref(tensor, self._released))

    def _released(
        self, ref: weakref.ref[torch.Tensor], finalizing: Callable[[], bool] = sys.is_finalizing
    ) -> None:
        if finalizing():  # the interpreter is tearing its modules down: nothing runs any more
            return
        self.holders.discard(ref)
        if not self.holders and self.on_free is not None:
            self.on_free(self)

    @property
    def numel(self) -> int:
        return int(self.physical.numel())

    def split(self) -> None:
        """The logical copy in storage of its own (a pinned buffer's two copies start as one
        tensor): a stream op about to write one copy at issue and the other when it runs, or a
        host op about to compute the logical copy from other copies than the physical one's."""
        if self.logical is self.physical:
            self.logical = self.physical.clone()

    def cell_ids(self) -> torch.Tensor:
        """Each element's cell number (its offset in the buffer), as int64."""
        if self._ids is None:
            self._ids = torch.arange(self.numel, dtype=torch.int64)
        return self._ids


def same_geometry(base: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The view of flat `base` with `like`'s sizes, strides and storage offset."""
    return base.as_strided(like.size(), like.stride(), like.storage_offset())


def geometry(view: torch.Tensor) -> Geometry:
    return tuple(view.size()), tuple(view.stride()), int(view.storage_offset())


def at(base: torch.Tensor, where: Geometry) -> torch.Tensor:
    """The view of flat `base` at `where`."""
    return base.as_strided(*where)


@lru_cache(maxsize=4096)
def span(start: int, count: int) -> np.ndarray:
    """Cells `start` to `start + count - 1`, one array per span: the same few spans (a row, a
    staging slice) recur at every iteration. Shared, as a strided view's cells share the
    buffer's `cell_ids`: footprints are never written to (torch would warn at every index
    made of a read-only array, so it is not marked so). Cells that are this very array are
    a span (a copy of them can be a slice's)."""
    return np.arange(start, start + count, dtype=np.int64)


def view_cells(buffer: Buffer, view: torch.Tensor) -> np.ndarray:
    """The cells of `buffer` that `view` (a view of it, same dtype) covers, in the view's order."""
    if view.is_contiguous():
        return span(view.storage_offset(), view.numel())
    ids: np.ndarray = as_numpy(same_geometry(buffer.cell_ids(), view).reshape(-1))
    return ids


class Memory:
    """The buffers of one run, by storage, with names given in allocation order."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self.pinned: dict[int, Buffer] = {}  # storage data pointer -> pinned buffer
        self._count = 0

    def new_device(self, numel: int, dtype: torch.dtype, hint: str) -> Buffer:
        """A device buffer of `numel` elements, filled with poison on both copies."""
        flat = torch.full((numel,), poison(dtype), dtype=dtype)
        return self._add(Buffer(self._name(hint), False, flat, flat.clone()))

    def new_pinned(self, numel: int, dtype: torch.dtype, hint: str) -> Buffer:
        """A pinned host buffer of `numel` elements, filled with poison, its two copies one tensor
        until `Buffer.split`. Its physical copy is the memory the program's tensors on it use
        (`pinned_tensor`)."""
        flat = torch.full((numel,), poison(dtype), dtype=dtype)
        buffer = self._add(Buffer(HOST_PREFIX + self._name(hint), True, flat, flat))
        self.pinned[flat.untyped_storage().data_ptr()] = buffer
        return buffer

    def retype_pinned(self, buffer: Buffer, dtype: torch.dtype, hint: str) -> Buffer:
        """A pinned buffer of `dtype` on `buffer`'s memory (its bytes, now as `dtype`), in its
        place: a later pinned tensor of another dtype the host allocator gave the memory to."""
        storage = buffer.physical.untyped_storage()
        numel = storage.nbytes() // dtype.itemsize
        flat = torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))
        if buffer.logical is buffer.physical:  # (still one: the new buffer's are too)
            logical = flat
        else:
            logical = buffer.logical.view(torch.uint8).view(dtype).clone()
        made = self._add(Buffer(HOST_PREFIX + self._name(hint), True, flat, logical))
        self.pinned[storage.data_ptr()] = made
        return made

    def pinned_of(self, tensor: torch.Tensor) -> Buffer | None:
        """The pinned buffer a plain CPU tensor is a view of, or None (pageable memory)."""
        if not self.pinned or not tensor.is_cpu:
            return None
        return self.pinned.get(tensor.untyped_storage().data_ptr())

    def any_pinned(self, values: Iterable[Any]) -> bool:
        """Whether an op's argument values (one level of lists down) hold a pinned tensor."""
        if not self.pinned:
            return False
        pinned = self.pinned
        for x in values:
            if isinstance(x, torch.Tensor):
                if x.is_cpu and x.untyped_storage().data_ptr() in pinned:
                    return True
            elif isinstance(x, list | tuple):
                for y in x:
                    if (
                        isinstance(y, torch.Tensor)
                        and y.is_cpu
                        and y.untyped_storage().data_ptr() in pinned
                    ):
                        return True
        return False

    @staticmethod
    def pinned_tensor(buffer: Buffer, where: Geometry) -> torch.Tensor:
        """A tensor of the program's on pinned `buffer` (not a view of ours: its own lifetime)."""
        flat = buffer.physical
        return torch.empty(0, dtype=flat.dtype).set_(flat.untyped_storage(), where[2], *where[:2])

    def rename(self, buffer: Buffer, name: str) -> str:
        """Give a well-known buffer (the token pool, the page table) its contract name."""
        old = buffer.name
        buffer.name = HOST_PREFIX + name if buffer.pinned else name
        if buffer.origin is not None:  # the later twins of the memory take the name too
            buffer.origin.name = buffer.name
        return old

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}#{self._count}"

    def _add(self, buffer: Buffer) -> Buffer:
        self.buffers.append(buffer)
        return buffer
