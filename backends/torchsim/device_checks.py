"""Where CUDA refuses a host tensor (or a host generator) in device work, which the simulated CUDA,
computing on the host, would run: the simulation asks here before each device op that has one.

Three sources, each the installed torch's own rule or a check seen on a GPU:

* **The generated wrappers.** PyTorch generates, for every op with a CUDA kernel of its own, a
  wrapper that checks all its positional and `out` tensors are on one device
  (`check_and_update_common_device`: any dimension, no exception for a 0-dim host tensor), unless
  the op's entry in `native_functions.yaml` says `device_check: NoCheck` (TensorIterator's ops,
  which allow host scalars; the index ops, which move host indices; copies). The structured
  kernels' `out=` must be on the inputs' device. The table ships with torch, in `torchgen`: the
  rule is that of the installed torch. Without the table nothing is checked here (a GPU error
  missed, never a false one).
* **The CUDA kernels' own checks** that the wrapper leaves to them (`KERNEL_CHECKS`), and the
  CUDA generator every CUDA random kernel requires.
* TensorIterator's pointwise ops and `cat` (a 0-dim host scalar allowed) stay in the dispatch.

Every refusal here was seen on an H200 (`tests/mixed_device_cases.py`, its outcomes in
`tests/data/mixed_devices_h200.json`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_TABLE = Path("packaged", "ATen", "native", "native_functions.yaml")
_SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


@dataclass(frozen=True)
class _Tables:
    checked: frozenset[str]  # ops whose CUDA wrapper checks its tensors' devices
    structured_out: frozenset[str]  # structured kernels' `out=` variants with a CUDA kernel
    composite: frozenset[str]  # ops whose CUDA kernel is their composite (no CUDA key of theirs)


def _cuda_keys(entry: dict[str, Any]) -> bool:
    """Whether an entry's `dispatch` names the CUDA key itself (not a composite's)."""
    dispatch = entry.get("dispatch") or {}
    return any("CUDA" in (k.strip() for k in str(keys).split(",")) for keys in dispatch)


@functools.cache
def _tables() -> _Tables:
    """Read once, on the first op with a host tensor among device tensors (0.1-0.3 s)."""
    try:
        import torchgen
        import yaml
    except ImportError:
        return _Tables(frozenset(), frozenset(), frozenset())
    path = Path(torchgen.__file__).parent / _TABLE
    try:
        entries = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return _Tables(frozenset(), frozenset(), frozenset())
    by_name: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, dict) and "func" in entry:
            by_name[str(entry["func"]).split("(", 1)[0]] = entry
    checked, structured_out, composite = set(), set(), set()
    for name, entry in by_name.items():
        if entry.get("structured") is True and _cuda_keys(entry):
            structured_out.add(name)
        keys = {k.strip() for keys in entry.get("dispatch") or {} for k in str(keys).split(",")}
        if keys & _COMPOSITE_KEYS and not _cuda_keys(entry):
            composite.add(name)
        if entry.get("device_check") == "NoCheck":
            continue
        delegate = by_name.get(str(entry.get("structured_delegate", "")))
        if _cuda_keys(entry) or (delegate is not None and _cuda_keys(delegate)):
            checked.add(name)
    return _Tables(frozenset(checked), frozenset(structured_out), frozenset(composite))


_COMPOSITE_KEYS = {"CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"}


def runs_as_composite(func: Any) -> bool:
    """Whether a GPU runs `func` as its composite kernel (its parts, each through the
    dispatcher, with their own checks): it has no CUDA kernel of its own."""
    return func.namespace == "aten" and overload_name(func) in _tables().composite


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
    if func.namespace != "aten" or overload_name(func) not in _tables().checked:
        return ()
    tensors = [(i, a) for i, a in enumerate(func._schema.arguments) if "Tensor" in str(a.type)]
    outs = [(i, a.name) for i, a in tensors if a.is_out]
    return (*outs, *((i, a.name) for i, a in tensors if not a.kwarg_only))


@functools.cache
def _structured_outs(func: Any) -> tuple[tuple[int, str], ...]:
    """The `out` arguments of a structured kernel's `out=` variant, else empty."""
    if func.namespace != "aten" or overload_name(func) not in _tables().structured_out:
        return ()
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments) if a.is_out)


@dataclass(frozen=True)
class KernelCheck:
    """A device check a CUDA kernel makes itself: the argument it checks, whether a 0-dim host
    tensor is refused too, its message, and its message when the op accumulates (`index_put_`'s
    accumulating kernel words it its own way)."""

    argument: str
    any_dim: bool
    message: str
    accumulating: str | None = None


_MASK = KernelCheck(
    "mask",
    True,
    "expected self and mask to be on the same device, but got mask on cpu and self on cuda:0",
)
_INDEX = KernelCheck("index", True, f"{_SAME_DEVICE}, cuda:0 and cpu!")
_VALUES = KernelCheck(
    "values",
    False,
    f"{_SAME_DEVICE}, cuda:0 and cpu!",
    "expected device cuda:0 but got device cpu for value tensor",
)
# By overload packet: the out-of-place forms are composites of the in-place ones.
KERNEL_CHECKS: dict[str, KernelCheck] = {
    "masked_fill_": _MASK,
    "masked_fill": _MASK,
    "index_fill_": _INDEX,
    "index_fill": _INDEX,
    "index_put_": _VALUES,
    "index_put": _VALUES,
    "_index_put_impl_": _VALUES,
}


def _value(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, name: str) -> Any:
    return args[at] if at < len(args) else kwargs.get(name)


def _is_host(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type != "cuda"


def mixed_devices(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """CUDA's message where it refuses `func`'s host tensors among device tensors, else None.
    Called only where a host tensor is among an op's device tensors."""
    common: str | None = None
    for position, name in checked_arguments(func):  # the wrapper: the first device against each
        value = _value(args, kwargs, position, name)
        for x in value if isinstance(value, list | tuple) else (value,):
            if not isinstance(x, torch.Tensor):
                continue
            device = "cuda:0" if x.device.type == "cuda" else str(x.device)
            if common is None:
                common = device
            elif device != common:
                method = overload_name(func).replace(".", "_")
                return (
                    f"Expected all tensors to be on the same device, but got {name} is on "
                    f"{device}, different from other tensors on {common} (when checking "
                    f"argument in method wrapper_CUDA_{method})"
                )
    for position, name in _structured_outs(func):
        if _is_host(_value(args, kwargs, position, name)):
            return "Expected out tensor to have device cuda:0, but got cpu instead"
    check = KERNEL_CHECKS.get(func.overloadpacket.__name__)
    if check is not None:
        names = [a.name for a in func._schema.arguments]
        if check.argument in names:
            at = names.index(check.argument)
            x = _value(args, kwargs, at, check.argument)
            if _is_host(x) and (check.any_dim or x.dim() > 0):
                accumulate = "accumulate" in names and _value(
                    args, kwargs, names.index("accumulate"), "accumulate"
                )
                return (check.accumulating if accumulate else None) or check.message
    return None


def host_generator(func: Any, at: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """CUDA's message for device random work given a host generator (argument `at`): every CUDA
    random kernel takes only a CUDA generator. None where it is one, or none is given."""
    generator = _value(args, kwargs, at, func._schema.arguments[at].name)
    if isinstance(generator, torch.Generator) and generator.device.type != "cuda":
        return f"Expected a 'cuda' device type for generator but found '{generator.device.type}'"
    return None
