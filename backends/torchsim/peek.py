"""Reading a simulated run's device values between steps, as the program sees them.

    with peeking():
        free = allocator.get_all_free_pages()   # the program's own code, on the logical copies

Inside the block every aten call that names a simulated tensor runs on its logical copy (the
values in program order), untraced and in no stream, and returns host tensors: books read off a
scheduler's own structures with the scheduler's own helpers, never adding to the trace. Inside a
run too (`peeked`): a scheduler's own consistency checks, which read its books as if every op
ran when issued, without the synchronizations they would add on a device.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from overlapcheck.backends.torchsim.dispatch import plain
from overlapcheck.backends.torchsim.tensor import SimTensor


def _logical(x: Any) -> Any:
    return x.logic if isinstance(x, SimTensor) else x


class _Peek(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        largs, lkwargs = tree_map(_logical, (args, kwargs or {}))
        device = lkwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            lkwargs["device"] = "cpu"
        with plain():  # the simulation's own modes, below this one, see nothing of it
            return func(*largs, **lkwargs)


@contextlib.contextmanager
def peeking() -> Iterator[None]:
    """Simulated tensors read as their logical copies inside the block (see the module)."""
    with _Peek():  # type: ignore[no-untyped-call]
        yield


def peeked(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, run inside `peeking()`."""

    @functools.wraps(method)
    def inside(*args: Any, **kwargs: Any) -> Any:
        with peeking():
            return method(*args, **kwargs)

    return inside
