"""Which cells an aten op reads and writes, from its schema, as PyTorch's CUDA sanitizer does.

Each tensor argument is read, or written when its schema's `alias_info.is_write` says so; fresh
outputs are written whole. Unlike a sanitizer keyed by data pointers, an access is the set of
cells of the buffer that the view covers (its storage offset and strides), so two views of one
pooled buffer conflict only where they overlap.

Index ops address cells by values: `pool[rows, cols] = x` writes only the indexed cells, and
`pool[mapping]` reads only those. For them the op itself runs once on a tensor of cell numbers
shaped like the indexed view, with the logical index values (`memory.py`), which gives exactly the
cells the op touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from overlapcheck.backends.torchsim.memory import Buffer, as_numpy, same_geometry, view_cells
from overlapcheck.backends.torchsim.schema import op_info
from overlapcheck.core.trace import Move

aten = torch.ops.aten
# A tensor's buffer, and a tensor with the view's sizes, strides and offset in it (the tensor
# itself, or its logical view: only the geometry is read), or None for pageable memory.
Locate = Callable[[torch.Tensor], tuple[Buffer, torch.Tensor] | None]


@dataclass(slots=True)
class Touch:
    """Cells of one buffer read or written by an op."""

    buffer: Buffer
    cells: np.ndarray
    mode: str  # "r" or "w"


def arguments(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(schema argument name, value) for every argument given."""
    info = op_info(func)
    names, by_name = info.names, info.by_name
    for i, value in enumerate(args):
        if i < len(names):
            yield names[i], value
    for name, value in kwargs.items():
        if name in by_name:
            yield name, value


def _indexed(
    locate: Locate, view: torch.Tensor, pick: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[Buffer, np.ndarray] | None:
    """The cells of `view`'s buffer that `pick` (an index op over a view) selects."""
    found = locate(view)
    if found is None:
        return None
    buffer, where = found
    ids = same_geometry(buffer.cell_ids(), where)
    picked: np.ndarray = as_numpy(pick(ids).reshape(-1)).astype(np.int64, copy=False)
    return buffer, picked


def _index_args(value: Any, logical: Callable[[Any], Any]) -> Any:
    return [None if v is None else logical(v) for v in value]


def _picking(indices: list[Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """`aten.index`'s selection by `indices` (an index op's list: None for a dimension taken
    whole). Python indexing reads a None as a new dimension, so only a list without one goes
    through it (the faster way in)."""
    if any(i is None for i in indices):
        return lambda ids: aten.index.Tensor(ids, indices)
    return lambda ids: ids[tuple(indices)]


def touches(
    func: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    locate: Locate,
    logical: Callable[[Any], Any],
) -> list[Touch]:
    """The reads, then the writes, of one op's tensor arguments (not its fresh outputs)."""
    reads: list[Touch] = []
    writes: list[Touch] = []
    info = op_info(func)
    skip = -1  # the argument an index op's precise cells replace
    if info.indexed:
        special = _precise(func, args, kwargs, locate, logical)
        if special is not None:
            for touch, arg_index in special:
                (writes if touch.mode == "w" else reads).append(touch)
                skip = arg_index
    written = info.written
    for i, value in enumerate(args):
        if i != skip and i < len(written):
            _add(locate, value, written[i], reads, writes)
    by_name = info.by_name
    for name, value in kwargs.items():
        found = by_name.get(name)
        if found is not None:
            _add(locate, value, found[1], reads, writes)
    return reads + writes


def _add(
    locate: Locate, value: Any, written: bool, reads: list[Touch], writes: list[Touch]
) -> None:
    """The cells of the tensors in one argument's value (one level of lists down), read or
    written."""
    if isinstance(value, torch.Tensor):
        found = locate(value)
        if found is not None:
            buffer, where = found
            if written:
                writes.append(Touch(buffer, view_cells(buffer, where), "w"))
            else:
                reads.append(Touch(buffer, view_cells(buffer, where), "r"))
    elif isinstance(value, list | tuple):
        for v in value:
            if isinstance(v, torch.Tensor):
                _add(locate, v, written, reads, writes)


def _precise(
    func: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    locate: Locate,
    logical: Callable[[Any], Any],
) -> list[tuple[Touch, int]] | None:
    """Index ops: the cells their indices select, and the argument (by position) they replace."""
    packet = op_info(func).packet
    if packet in (aten.index_put_, aten._index_put_impl_) and len(args) >= 3:
        indices = _index_args(args[1], logical)
        found = _indexed(locate, args[0], _picking(indices))
        accumulate = bool(args[3]) if len(args) > 3 else bool(kwargs.get("accumulate", False))
        return _picked(found, "w", 0, also_read=accumulate)
    if packet is aten.index and len(args) >= 2:
        indices = _index_args(args[1], logical)
        return _picked(_indexed(locate, args[0], _picking(indices)), "r", 0)
    if packet is aten.index_select and len(args) >= 3:
        dim, index = int(args[1]), logical(args[2])
        return _picked(_indexed(locate, args[0], lambda ids: ids.index_select(dim, index)), "r", 0)
    if packet is aten.gather and len(args) >= 3:
        dim, index = int(args[1]), logical(args[2])
        return _picked(_indexed(locate, args[0], lambda ids: ids.gather(dim, index)), "r", 0)
    if packet in (aten.scatter_, aten.scatter_add_) and len(args) >= 3:
        dim, index = int(args[1]), logical(args[2])
        found = _indexed(locate, args[0], lambda ids: ids.gather(dim, index))
        return _picked(found, "w", 0, also_read=packet is aten.scatter_add_)
    if packet in (aten.index_copy_, aten.index_fill_) and len(args) >= 3:
        dim, index = int(args[1]), logical(args[2])
        return _picked(_indexed(locate, args[0], lambda ids: ids.index_select(dim, index)), "w", 0)
    if packet is aten.masked_fill_ and len(args) >= 2:
        mask = logical(args[1])
        found = _indexed(locate, args[0], lambda ids: ids[mask.expand_as(ids)])
        return _picked(found, "w", 0)
    if packet is aten.embedding and len(args) >= 2:
        index = logical(args[1])
        return _picked(_indexed(locate, args[0], lambda ids: ids[index]), "r", 0)
    return None


def _picked(
    found: tuple[Buffer, np.ndarray] | None, mode: str, arg: int, also_read: bool = False
) -> list[tuple[Touch, int]] | None:
    if found is None:
        return None
    out = [(Touch(found[0], found[1], mode), arg)]
    if also_read:
        out.insert(0, (Touch(found[0], found[1], "r"), arg))
    return out


# Kernels whose output's elements are copies of elements of their first tensor argument, in
# the order the footprint lists them (a gather's precise read, a clone's view): `moves`.
_GATHERS = frozenset(
    [aten.index, aten.index_select, aten.gather, aten.embedding, aten.clone, aten._to_copy]
)


def moves(func: Any, found: Sequence[Touch]) -> tuple[Move, ...]:
    """Which cell each written cell of a data-moving kernel took its value from: a gather's or
    clone's output from its source (the first read: an index op's precise cells), `copy_`'s
    destination from its source. Only where the two lists match one to one (a broadcasting
    copy does not); () for any other kernel."""
    packet = op_info(func).packet
    reads = [t for t in found if t.mode == "r"]
    writes = [t for t in found if t.mode == "w"]
    if packet in _GATHERS and reads and writes:
        src, dst = reads[0], writes[-1]  # (the fresh output's write comes last)
    elif packet is aten.copy_ and len(reads) == 1 and len(writes) == 1:
        src, dst = reads[0], writes[0]
    else:
        return ()
    if len(src.cells) != len(dst.cells) or src.buffer is dst.buffer:
        return ()
    return (Move(src.buffer.name, src.cells, dst.buffer.name, dst.cells),)
