"""What SGLang needs to run on the simulated CUDA (`backends/torchsim`) as on a CUDA device: a
few module attributes stood in for while its code runs, none of its lines edited.

* Its process groups on Gloo: a build without CUDA has no NCCL (tensor parallelism is 1, so no
  collective ever carries device data).
* Its platform (found as the CPU's on a build without CUDA) says pinned memory is available,
  as its CUDA platform does: its host staging is pinned, its copies asynchronous.
* No dummy weights drawn: the toy model has none, and a CUDA generator needs the CUDA library.
* Its fused ops on their torch backend (`set_fused_op_backend`, SGLang's own switch: each runs
  its `forward_native`, traced by torchsim op by op), and the Triton kernels on the scheduling
  path as kernels with a declared footprint (`triton_ops.py`).
* Its WAR barrier on (`SGLANG_ENABLE_WAR_BARRIER`): SGLang enables it on CUDA (`is_cuda()`),
  which it reads as false on a build without CUDA.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from overlapcheck.adapters.base import Loaded
from overlapcheck.adapters.sglang.triton_ops import ACTIVE
from overlapcheck.adapters.sglang.triton_ops import stand_ins as kernel_stand_ins
from overlapcheck.adapters.sglang.upstream import module
from overlapcheck.backends.torchsim.session import SimulatedCuda

# SGLang's fused ops (`BaseFusedOp`: JIT-compiled CUDA, or their `forward_native` in torch).
FUSED = "sglang.kernels.fused_op"
# SGLang's switches for what it does on CUDA, read at each use.
CUDA_ENV = {"SGLANG_ENABLE_WAR_BARRIER": "1"}


def _gloo(*, device: str) -> str:
    return "gloo"


def _no_weights(model: Any, *args: Any, **kwargs: Any) -> None:
    return None


def _pinnable(device: Any = None) -> bool:
    """SGLang's CUDA platform's answer: pinned host memory for any device but the host."""
    return device is None or str(device) != "cpu"


def stand_ins(loaded: Loaded) -> list[tuple[Any, str, Any]]:
    """(module, attribute, stand-in) for the duration of a block."""
    platform = module(loaded, "sglang.srt.platforms", "current_platform").current_platform
    out: list[tuple[Any, str, Any]] = [
        (platform, "is_pin_memory_available", _pinnable),
        (module(loaded, "sglang.srt.distributed.bootstrap", "_resolve_backend"),
         "_resolve_backend", _gloo),
        (module(loaded, "sglang.srt.model_loader.loader", "initialize_dummy_weights"),
         "initialize_dummy_weights", _no_weights),
    ]  # fmt: skip
    return out + kernel_stand_ins(loaded)


@contextlib.contextmanager
def standing_in(loaded: Loaded, cuda: SimulatedCuda) -> Iterator[None]:
    """SGLang's module attributes replaced inside the block, restored after it; the Triton
    stand-ins launch on `cuda`."""
    for name, value in CUDA_ENV.items():
        os.environ.setdefault(name, value)
    fused = module(loaded, FUSED, "set_fused_op_backend")
    saved: list[tuple[Any, str, Any]] = []
    before = fused.get_fused_op_backend()
    try:
        for owner, name, value in stand_ins(loaded):
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)
        fused.set_fused_op_backend(fused.KernelBackend.TORCH)
        ACTIVE.cuda = cuda
        yield
    finally:
        ACTIVE.cuda = None
        fused.set_fused_op_backend(before)
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def name_streams(cuda: SimulatedCuda, streams: dict[str, Any]) -> None:
    """Name SGLang's streams (by the attribute that holds each) as the trace's agents, in the ops
    traced while it was built too."""
    renamed: dict[str, str] = {}
    for name, stream in streams.items():
        renamed[stream.name] = name
        stream.name = name
    for op in cuda.device.trace.ops:
        op.agent = renamed.get(op.agent, op.agent)
