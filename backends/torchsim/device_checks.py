"""Which arguments CUDA's kernel wrappers require on one device, read from torch's own op table.

PyTorch generates, for every op with a CUDA kernel of its own, a wrapper that checks all its
positional and `out` tensors are on one device (`check_and_update_common_device`, any dimension:
no exception for a 0-dim host tensor), unless the op's entry in `native_functions.yaml` says
`device_check: NoCheck` (TensorIterator's ops, which allow host scalars, and copies). A composite
op (no CUDA kernel of its own) checks nothing itself. The table ships with torch, in `torchgen`,
so the rule is that of the installed torch; the simulated CUDA runs every op on the host, where
nothing checks, and asks here instead. Without the table nothing is checked (a GPU error missed,
never a false one).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

_TABLE = Path("packaged", "ATen", "native", "native_functions.yaml")


def _cuda_keys(entry: dict[str, Any]) -> bool:
    """Whether an entry's `dispatch` names the CUDA key itself (not a composite's)."""
    dispatch = entry.get("dispatch") or {}
    return any("CUDA" in (k.strip() for k in str(keys).split(",")) for keys in dispatch)


@functools.cache
def _checked_ops() -> frozenset[str]:
    """The `name.overload` of every op whose CUDA wrapper checks its tensors' devices."""
    try:
        import torchgen
        import yaml
    except ImportError:
        return frozenset()
    path = Path(torchgen.__file__).parent / _TABLE
    try:
        entries = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return frozenset()
    by_name: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, dict) and "func" in entry:
            by_name[str(entry["func"]).split("(", 1)[0]] = entry
    checked = set()
    for name, entry in by_name.items():
        if entry.get("device_check") == "NoCheck":
            continue
        delegate = by_name.get(str(entry.get("structured_delegate", "")))
        if _cuda_keys(entry) or (delegate is not None and _cuda_keys(delegate)):
            checked.add(name)
    return frozenset(checked)


def overload_name(func: Any) -> str:
    """`index_select` for `aten.index_select.default`, `scatter_.src` for that overload."""
    overload = func._overloadname
    base = func.overloadpacket.__name__
    return base if overload == "default" else f"{base}.{overload}"


@functools.cache
def checked_arguments(func: Any) -> tuple[tuple[int, str], ...]:
    """The (position, name) of each argument `func`'s CUDA wrapper requires on one device, in
    the order it checks them: its `out` tensors, then its positional ones (tensors, optional
    tensors, lists of them). Empty where it checks nothing."""
    if func.namespace != "aten" or overload_name(func) not in _checked_ops():
        return ()
    tensors = [(i, a) for i, a in enumerate(func._schema.arguments) if "Tensor" in str(a.type)]
    outs = [(i, a.name) for i, a in tensors if a.is_out]
    return (*outs, *((i, a.name) for i, a in tensors if not a.kwarg_only))


def mixed_devices(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """CUDA's message where `func`'s wrapper would find a host tensor among device tensors
    (the first checked tensor's device against a later one's, as the wrapper reports), else
    None. Called only where a host tensor is among an op's device tensors."""
    common: str | None = None
    for position, name in checked_arguments(func):
        if position < len(args):
            value = args[position]
        elif name in kwargs:
            value = kwargs[name]
        else:
            continue
        for x in value if isinstance(value, list | tuple) else (value,):
            if not isinstance(x, torch.Tensor):
                continue
            device = "cuda:0" if x.device.type == "cuda" else str(x.device)
            if common is None:
                common = device
            elif device != common:
                return (
                    "Expected all tensors to be on the same device, but found at least two "
                    f"devices, {common} and {device}! (when checking argument for argument "
                    f"{name} in method wrapper_CUDA_{overload_name(func)})"
                )
    return None
