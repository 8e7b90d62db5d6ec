"""The simulated device tensor: a `cuda` tensor to the program, two CPU views underneath."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from overlapcheck.backends.torchsim.indexing import getitem, setitem
from overlapcheck.backends.torchsim.memory import Buffer


class SimulatedCudaError(RuntimeError):
    """A simulated CUDA tensor used where the simulation cannot follow it."""


class SimTensor(torch.Tensor):
    """A tensor on `cuda:0` whose elements live in a `Buffer`: `phys` and `logic` are views of
    its physical and logical copies with this tensor's sizes, strides and storage offset."""

    buffer: Buffer
    phys: torch.Tensor
    logic: torch.Tensor

    @staticmethod
    def __new__(
        cls, buffer: Buffer, phys: torch.Tensor, logic: torch.Tensor, device: torch.device
    ) -> SimTensor:
        made = torch.Tensor._make_wrapper_subclass(
            cls,
            phys.size(),
            strides=phys.stride(),
            storage_offset=phys.storage_offset(),
            dtype=phys.dtype,
            device=device,
            requires_grad=False,
        )
        assert isinstance(made, SimTensor)
        made.buffer = buffer
        made.phys = phys
        made.logic = logic
        buffer.hold(made)
        return made

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        raise SimulatedCudaError(
            f"a simulated CUDA tensor ({func}) was used outside the run that made it"
        )

    def __getitem__(self, index: Any) -> Any:
        return getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        setitem(self, index, value)

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        # torch's binding guards the device first, as indexing does (see indexing.py)
        out: torch.Tensor = torch.ops.aten.copy_.default(self, src, non_blocking)
        return out

    # Methods whose binding reads the data or guards the device itself, before any dispatch:
    # the same through the dispatcher (a read of a value is an implicit sync, as on CUDA).

    def tolist(self) -> Any:
        return self.to("cpu").tolist()

    def __invert__(self) -> torch.Tensor:
        return torch.ops.aten.bitwise_not.default(self)  # type: ignore[no-any-return]

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        return int(self.item())

    def contiguous(
        self, memory_format: torch.memory_format = torch.contiguous_format
    ) -> torch.Tensor:
        if self.is_contiguous(memory_format=memory_format):
            return self
        out: torch.Tensor = torch.ops.aten.clone.default(self, memory_format=memory_format)
        return out

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        return nonzero(self, as_tuple=as_tuple)

    def new_tensor(self, data: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return torch.tensor(data, **kwargs)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"SimTensor({self.buffer.name}, shape={list(self.shape)}, dtype={self.dtype})"


def nonzero(tensor: torch.Tensor, *, as_tuple: bool = False) -> Any:
    """`torch.nonzero` of a simulated device tensor through the dispatcher (its binding guards
    the device first); with `as_tuple`, one index tensor per dimension, as torch gives them."""
    if not as_tuple:
        found: torch.Tensor = torch.ops.aten.nonzero.default(tensor)
        return found
    if tensor.dim() == 0:  # (torch's rule: a scalar counts as one element)
        tensor = torch.ops.aten.unsqueeze.default(tensor, 0)
    return tuple(torch.ops.aten.unbind.int(torch.ops.aten.nonzero.default(tensor), 1))


def nonzero_of(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.nonzero` while the simulation lasts: a simulated device tensor's through
    `nonzero`, anything else (an `out=` argument too) as torch does it."""

    def stand_in(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if isinstance(input, SimTensor) and not args and set(kwargs) <= {"as_tuple"}:
            return nonzero(input, as_tuple=bool(kwargs.get("as_tuple", False)))
        return original(input, *args, **kwargs)

    return stand_in
