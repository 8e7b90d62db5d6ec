"""SGLang's Triton kernels on the scheduling path, as kernels of the simulated CUDA with a
declared footprint: each one launch on the current stream, that reads and writes the cells the
Triton kernel does and computes what it computes (on the logical copies at issue, on the
physical copies when the stream runs it). Its site is SGLang's caller: this module's frames are
not the program's (`torchsim.dispatch.not_program`).

* `write_cache_indices` (`mem_cache/allocation.py`): SGLang's path with a Triton-capable
  attention backend (every CUDA one) writes each request's `req_to_token` row in one launch of
  `write_req_to_token_pool_triton`: its prefix's KV indices, then its new ones from
  `out_cache_loc`. (Its torch fallback, taken for `torch_native`, syncs per request.)
* `compute_position_kernel` (`kernels/ops/attention/position.py`), which the same backends run
  for a prefill's positions (`compute_position`'s torch fallback syncs on device values).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from overlapcheck.adapters.base import Loaded
from overlapcheck.adapters.sglang.upstream import module
from overlapcheck.backends.torchsim.dispatch import not_program, plain, where
from overlapcheck.backends.torchsim.memory import view_cells
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.backends.torchsim.tensor import SimTensor

not_program(__file__)

Cells = np.ndarray | None


class _Active:
    """The simulated CUDA of the run being stepped (one at a time in a process)."""

    cuda: SimulatedCuda | None = None


ACTIVE = _Active()


def _values(tensor: torch.Tensor, cells: Cells, physical: bool) -> np.ndarray:
    if not isinstance(tensor, SimTensor):  # a host value, staged at the call
        return np.asarray(tensor.numpy()).reshape(-1) if cells is None else tensor.numpy()
    view = tensor.phys if physical else tensor.logic
    if cells is None:
        return np.asarray(view.numpy()).reshape(-1)
    buffer = tensor.buffer.physical if physical else tensor.buffer.logical
    return np.asarray(buffer.reshape(-1)[torch.from_numpy(cells)].numpy())


def _store(tensor: SimTensor, cells: Cells, values: np.ndarray, physical: bool) -> None:
    if cells is None:
        view = tensor.phys if physical else tensor.logic
        view.copy_(torch.from_numpy(values).reshape(view.shape).to(view.dtype))
        return
    buffer = tensor.buffer.physical if physical else tensor.buffer.logical
    flat = buffer.reshape(-1)
    flat[torch.from_numpy(cells)] = torch.from_numpy(values).to(flat.dtype)


def launch(
    name: str,
    reads: Sequence[tuple[torch.Tensor, Cells]],
    writes: Sequence[tuple[SimTensor, Cells]],
    compute: Callable[[list[np.ndarray]], list[np.ndarray]],
) -> None:
    """One kernel on the current stream: reads the cells of `reads` (None: the whole view),
    writes `compute(read values)` into the cells of `writes`."""
    cuda = ACTIVE.cuda
    assert cuda is not None, "a Triton stand-in outside a simulated run"
    reads = [(t.clone() if not isinstance(t, SimTensor) else t, c) for t, c in reads]
    with plain():
        for (tensor, cells), values in zip(
            writes, compute([_values(t, c, False) for t, c in reads]), strict=True
        ):
            _store(tensor, cells, values, False)
    accesses: list[tuple[torch.Tensor, np.ndarray | None, str]] = [
        (t, c, "r") for t, c in reads if isinstance(t, SimTensor)
    ]
    accesses += [(t, c, "w") for t, c in writes]

    def start() -> Callable[[], None]:
        with plain():
            got = compute([_values(t, c, True) for t, c in reads])

        def end() -> None:
            with plain():
                for (tensor, cells), values in zip(writes, got, strict=True):
                    _store(tensor, cells, values, True)

        return end

    cost = cuda.device.timing.cost("kernel", 4e-6)
    cuda.launch("kernel", f"{name} @{where()[0]}", accesses, cost, start)


def _row_cells(rows: SimTensor, row: int, begin: int, end: int) -> np.ndarray:
    with plain():
        return view_cells(rows.buffer, rows.logic[row, begin:end])


def write_cache_indices(
    out_cache_loc: torch.Tensor,
    req_pool_indices_tensor: torch.Tensor,
    req_pool_indices_cpu: torch.Tensor,
    prefix_lens_tensor: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens_tensor: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    extend_lens_tensor: torch.Tensor,
    extend_lens_cpu: torch.Tensor,
    prefix_tensors: list[torch.Tensor],
    req_to_token_pool: Any,
) -> None:
    """`write_req_to_token_pool_triton` over the batch, in one launch."""
    rows: SimTensor = req_to_token_pool.req_to_token
    with plain():
        slots = [int(x) for x in req_pool_indices_cpu.tolist()]
        prefix = [int(x) for x in prefix_lens_cpu.tolist()]
        ends = [int(x) for x in seq_lens_cpu.tolist()]
    prefix_cells = [_row_cells(rows, s, 0, p) for s, p in zip(slots, prefix, strict=True)]
    new_cells = [_row_cells(rows, s, p, e) for s, p, e in zip(slots, prefix, ends, strict=True)]
    reads: list[tuple[torch.Tensor, Cells]] = [
        (req_pool_indices_tensor, None),
        (prefix_lens_tensor, None),
        (seq_lens_tensor, None),
        (extend_lens_tensor, None),
        (out_cache_loc, None),
    ]
    reads += [(t[:p], None) for t, p in zip(prefix_tensors, prefix, strict=True)]
    writes = [(rows, np.concatenate(prefix_cells + new_cells))]

    def compute(values: list[np.ndarray]) -> list[np.ndarray]:
        loc, prefixes = values[4].astype(np.int64), values[5:]
        new, at = [], 0
        for p, e in zip(prefix, ends, strict=True):
            new.append(loc[at : at + e - p])
            at += e - p
        return [np.concatenate([*(x.astype(np.int64) for x in prefixes), *new])]

    launch("write_req_to_token_pool_triton", reads, writes, compute)


class _Grid:
    """`kernel[grid](*args)`: the stand-in called with the kernel's arguments."""

    def __init__(self, body: Callable[..., None]) -> None:
        self.body = body

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.body


def _compute_position(
    positions: SimTensor,
    start_loc: SimTensor,
    prefix_lens: SimTensor,
    seq_lens: SimTensor,
    has_prefix: bool,
) -> None:
    """`compute_position_kernel`: each sequence's positions `prefix .. prefix + extend` and
    where its tokens start in the batch."""
    reads: list[tuple[torch.Tensor, Cells]] = [(seq_lens, None)]
    if has_prefix:
        reads.append((prefix_lens, None))

    def compute(values: list[np.ndarray]) -> list[np.ndarray]:
        lens = values[0].astype(np.int64)
        pre = values[1].astype(np.int64) if has_prefix else np.zeros_like(lens)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        pos = [np.arange(p, p + n, dtype=np.int64) for p, n in zip(pre, lens, strict=True)]
        return [np.concatenate(pos or [np.zeros(0, dtype=np.int64)]), starts]

    launch("compute_position_kernel", reads, [(positions, None), (start_loc, None)], compute)


def _supports_triton(backend: str) -> bool:
    return True


def stand_ins(loaded: Loaded) -> list[tuple[Any, str, Any]]:
    """(module, attribute, stand-in) for SGLang's Triton kernels."""
    allocation = module(loaded, "sglang.srt.mem_cache.allocation", "write_cache_indices")
    batch_info = module(loaded, "sglang.srt.model_executor.forward_batch_info", "support_triton")
    position = module(loaded, "sglang.kernels.ops.attention.position", "compute_position_kernel")
    return [
        (allocation, "write_cache_indices", write_cache_indices),
        (batch_info, "support_triton", _supports_triton),
        (position, "compute_position_kernel", _Grid(_compute_position)),
    ]
