"""Python indexing (`t[i]`, `t[a:b, rows]`, `t[idx] = v`) of simulated device tensors.

Torch's own `__getitem__` guards the tensor's device before it dispatches, and a build without
CUDA has no device to guard, so indexing a "cuda" tensor there fails before any mode sees it. This
is the same translation into aten ops that torch makes (`applySlicing`): integers select, slices
slice, `None` adds a dimension, `...` skips the dimensions it covers, and tensors (or lists) become
the indices of one advanced-indexing op (`index`, or `index_put_` to assign).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
# The overloads' C++ entries: `OpOverload.__call__` is a Python frame that only calls them.
_unsqueeze = aten.unsqueeze.default._op
_select = aten.select.int._op
_slice = aten.slice.Tensor._op
_alias = aten.alias.default._op
_index = aten.index.Tensor._op
_copy = aten.copy_.default._op
_fill = aten.fill_.Scalar._op
_index_put = aten.index_put_.default._op


def _as_tuple(index: Any) -> tuple[Any, ...]:
    if isinstance(index, tuple):
        return index
    return (index,)


def _basic(self: torch.Tensor, index: Any) -> tuple[torch.Tensor, list[Any] | None]:
    """Apply the basic part of `index`; the advanced indices (by the view's dimensions), if any."""
    items = list(_as_tuple(index))
    consumed = sum(
        0
        if (it is None or it is Ellipsis or isinstance(it, bool))
        else (it.dim() if isinstance(it, torch.Tensor) and it.dtype == torch.bool else 1)
        for it in items
    )
    # by identity: `Ellipsis in items` compares a tensor item with `==`, tens of microseconds
    at = next((i for i, it in enumerate(items) if it is Ellipsis), None)
    if at is not None:
        items[at : at + 1] = [slice(None)] * (self.dim() - consumed)
    view = self
    dim = 0
    advanced: list[Any] = []
    any_advanced = False
    for item in items:
        if item is None:
            view = _unsqueeze(view, dim)
            advanced.append(None)
            dim += 1
        elif isinstance(item, bool):
            view = _unsqueeze(view, dim)
            mask = torch.tensor([item])
            advanced.append(mask)
            any_advanced = True
            dim += 1
        elif isinstance(item, int | torch.SymInt):
            view = _select(view, dim, int(item))
        elif isinstance(item, slice):
            start = 0 if item.start is None else item.start
            stop = item.stop if item.stop is not None else torch.iinfo(torch.int64).max
            step = 1 if item.step is None else item.step
            view = _slice(view, dim, start, stop, step)
            advanced.append(None)
            dim += 1
        elif isinstance(item, torch.Tensor | list):
            tensor = item if isinstance(item, torch.Tensor) else torch.tensor(item)
            advanced.append(tensor)
            any_advanced = True
            dim += tensor.dim() if tensor.dtype == torch.bool else 1
        else:
            raise IndexError(f"unsupported index {item!r} of a simulated CUDA tensor")
    if not any_advanced:
        return view, None
    while advanced and advanced[-1] is None:
        advanced.pop()
    return view, advanced


def getitem(self: torch.Tensor, index: Any) -> torch.Tensor:
    view, advanced = _basic(self, index)
    if advanced is None:
        if view is self:
            alias: torch.Tensor = _alias(self)
            return alias
        return view
    picked: torch.Tensor = _index(view, advanced)
    return picked


def setitem(self: torch.Tensor, index: Any, value: Any) -> None:
    view, advanced = _basic(self, index)
    if advanced is None:
        if isinstance(value, torch.Tensor):
            _copy(view, value)
        else:
            _fill(view, value)
        return
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=self.dtype)
    _index_put(view, advanced, value)
