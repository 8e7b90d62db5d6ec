"""Device and pinned host buffers of the simulated CUDA.

Every buffer is a flat CPU tensor twice over:

* `physical`: what the simulated device (or the pinned host page) holds now, in simulated time. A
  stream op writes it when the op ends; the host reads it whenever it reads.
* `logical`: the values in program order, as if each op had run when the host issued it. Shapes,
  the cells an index op touches, and the books of a scheduler are read from it: it is what the
  program means, where `physical` is what the hardware did (the two differ only after a race).

A buffer is never reused: each allocation is a fresh buffer with a fresh name, so PyTorch's caching
allocators (which hand a block to another user only once the streams that used it are done) can
never make a correct program look racy here. Names are given in allocation order, so the same
program names its buffers the same way in any process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

HOST_PREFIX = "host:"


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

    @property
    def numel(self) -> int:
        return int(self.physical.numel())

    def cell_ids(self) -> torch.Tensor:
        """Each element's cell number (its offset in the buffer), as int64."""
        if self._ids is None:
            self._ids = torch.arange(self.numel, dtype=torch.int64)
        return self._ids


def same_geometry(base: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The view of flat `base` with `like`'s sizes, strides and storage offset."""
    return base.as_strided(like.size(), like.stride(), like.storage_offset())


def view_cells(buffer: Buffer, view: torch.Tensor) -> np.ndarray:
    """The cells of `buffer` that `view` (a view of it, same dtype) covers, in the view's order."""
    if view.is_contiguous():
        start = int(view.storage_offset())
        return np.arange(start, start + view.numel(), dtype=np.int64)
    ids: np.ndarray = same_geometry(buffer.cell_ids(), view).reshape(-1).numpy()
    return ids


class Memory:
    """The buffers of one run, by storage, with names given in allocation order."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self._pinned: dict[int, Buffer] = {}  # storage data pointer -> pinned buffer
        self._count = 0

    def new_device(self, like: torch.Tensor, hint: str) -> Buffer:
        """A device buffer big enough for `like`'s storage, filled with poison on both copies."""
        numel = like.untyped_storage().nbytes() // like.element_size()
        flat = torch.full((numel,), poison(like.dtype), dtype=like.dtype)
        return self._add(Buffer(self._name(hint), False, flat, flat.clone()))

    def adopt_pinned(self, tensor: torch.Tensor, hint: str) -> Buffer:
        """Make `tensor`'s storage (a plain CPU tensor the program will use) a pinned buffer; its
        values now are both its physical and its logical contents."""
        numel = tensor.untyped_storage().nbytes() // tensor.element_size()
        flat = torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage(), 0, (numel,), (1,))
        buffer = self._add(Buffer(HOST_PREFIX + self._name(hint), True, flat, flat.clone()))
        self._pinned[tensor.untyped_storage().data_ptr()] = buffer
        return buffer

    def pinned_of(self, tensor: torch.Tensor) -> Buffer | None:
        """The pinned buffer a plain CPU tensor is a view of, or None (pageable memory)."""
        if not self._pinned or tensor.device.type != "cpu":
            return None
        return self._pinned.get(tensor.untyped_storage().data_ptr())

    def rename(self, buffer: Buffer, name: str) -> str:
        """Give a well-known buffer (the token pool, the page table) its contract name."""
        old = buffer.name
        buffer.name = HOST_PREFIX + name if buffer.pinned else name
        return old

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}#{self._count}"

    def _add(self, buffer: Buffer) -> Buffer:
        self.buffers.append(buffer)
        return buffer
