"""What the simulated CUDA reads of an aten op overload, read once per overload.

The dispatch runs for every aten call of the program, and each question put to torch's schema
objects (or an overload's hash, a Python method) is a Python call or several. `op_info(func)`
answers them all from one dictionary lookup by the overload's identity: overloads are created
once per process and live as long as it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten

_EMPTY = frozenset(
    {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided}
)
# Factories from a tensor's metadata: they read none of its values.
_LIKE = frozenset(
    {
        aten.empty_like,
        aten.zeros_like,
        aten.ones_like,
        aten.full_like,
        aten.new_empty,
        aten.new_empty_strided,
        aten.new_zeros,
        aten.new_ones,
        aten.new_full,
    }
)
# Views that stand for a read of their values below the dispatcher: `tolist()` and `numpy()` call
# them (in inference mode) just before they read the memory, which no mode sees.
_READ_BELOW = frozenset({aten.resolve_conj, aten.resolve_neg})

INDEXED = frozenset(
    {
        aten.index_put_,
        aten._index_put_impl_,
        aten.index,
        aten.index_select,
        aten.gather,
        aten.scatter_,
        aten.scatter_add_,
        aten.index_copy_,
        aten.index_fill_,
        aten.masked_fill_,
        aten.embedding,
    }
)  # the index ops `footprint._precise` knows


@dataclass(frozen=True, slots=True)
class OpInfo:
    """One overload, as the interceptor and the footprints use it."""

    func: Any
    call: Any  # `func`'s C++ entry (`OpOverload.__call__` is a Python frame that only calls it)
    packet: Any  # its overload packet (`aten.slice`)
    name: str  # the packet's name, for labels
    view: bool  # returns views of its arguments and writes none
    # Whether it reads its arguments' values (on the host, where a pinned buffer's reads are
    # traced): a view reads none, nor does a factory from a tensor's metadata (`like`), but for
    # the two views torch emits where a conversion (`tolist`, `numpy`) reads below the dispatcher.
    reads: bool
    empty: bool  # allocates memory whose contents are undefined (`empty`, `new_empty`, ...)
    like: bool  # a factory from a tensor's metadata, reading none of its values
    dynamic: bool  # its output's shape may depend on its input values
    # All its tensors on one device but for 0-dim host scalars, as CUDA's kernels check
    # (TensorIterator's pointwise ops, `cat`): a host tensor of one or more dimensions among
    # device tensors is an error on a GPU.
    one_device: bool
    indexed: bool  # addresses cells by index values (`INDEXED`)
    generator: int | None  # the position of its generator argument, if it takes one
    # Made of other ops (a `CompositeImplicitAutograd` kernel, which the autograd key runs but
    # inference mode skips): device work runs its parts, as on a GPU. Views, and ops that give
    # the host a value (a truth test's `is_nonzero`: one sync, named as the program called it),
    # stay whole.
    composite: bool
    # Its composite kernel below autograd (`CompositeExplicitAutograd`, or None), which a GPU
    # runs where it has no CUDA kernel of its own (`device_checks.runs_as_composite`).
    explicit: Any
    # Per return: the index of the argument it aliases when that one is written, else None.
    aliases: tuple[int | None, ...]
    written: tuple[bool, ...]  # per schema argument, by position: whether the op writes it
    by_name: dict[str, tuple[int, bool]]  # argument name -> (position, written)
    names: tuple[str, ...]  # the schema's argument names, by position


_INFO: dict[int, OpInfo] = {}


def op_info(func: Any) -> OpInfo:
    """`func`'s info, read from its schema on first use."""
    found = _INFO.get(id(func))
    if found is None or found.func is not func:
        found = _INFO[id(func)] = _read(func)
    return found


def _read(func: Any) -> OpInfo:
    schema = func._schema
    arguments = list(schema.arguments)
    written = tuple(a.alias_info is not None and a.alias_info.is_write for a in arguments)
    packet = func.overloadpacket
    view = (
        not any(written)
        and bool(schema.returns)
        and all(r.alias_info is not None for r in schema.returns)
    )
    like = packet in _LIKE
    return OpInfo(
        func=func,
        call=getattr(func, "_op", func),
        packet=packet,
        name=packet.__name__,
        view=view,
        reads=packet in _READ_BELOW or not (view or like),
        empty=packet in _EMPTY,
        like=like,
        dynamic=torch.Tag.dynamic_output_shape in func.tags,
        one_device=torch.Tag.pointwise in func.tags or packet is aten.cat,
        indexed=packet in INDEXED,
        generator=next((i for i, a in enumerate(arguments) if "Generator" in str(a.type)), None),
        composite=not view
        and bool(schema.returns)
        and all(str(r.type) == "Tensor" for r in schema.returns)
        and torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        ),
        explicit=_explicit_key(func.name()),
        aliases=_write_returns(schema),
        written=written,
        by_name={a.name: (i, w) for i, (a, w) in enumerate(zip(arguments, written, strict=True))},
        names=tuple(a.name for a in arguments),
    )


def _write_returns(schema: Any) -> tuple[int | None, ...]:
    """For each return: the index of the argument it aliases when that one is written (an
    in-place or `out=` op), else None."""
    sets = {}
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is not None and info.is_write:
            for s in info.before_set:
                sets[s] = i
    out: list[int | None] = []
    for ret in schema.returns:
        info = ret.alias_info
        found = None
        if info is not None and info.is_write:
            found = next((sets[s] for s in info.before_set if s in sets), None)
        out.append(found)
    return tuple(out)


_EXPLICIT = (
    torch._C.DispatchKey.CompositeExplicitAutograd,
    torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
)


def _explicit_key(name: str) -> Any:
    for key in _EXPLICIT:
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            return key
    return None
