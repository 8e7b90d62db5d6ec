"""Paged attention: FlashInfer's paged prefill/decode wrappers on CUDA, a torch reference on CPU.

Both follow FlashInfer's split: `plan` runs on the host when the batch's metadata is staged (on
the scheduler stream: its H2D copies go there), `run` runs per layer inside the forward. The page
indices are not part of the plan: the forward computes them on the engine stream from the device
page table (`indexing.py`) into a per-parity buffer that the plan only points at, so attention
reads the page table as the device holds it, not the host's idea of it.

Plans are double-buffered by batch parity, like the metadata: planning batch N+1 must not touch
what forward N (still running) reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from overlapcheck.backends.gpu.weights import ModelSpec
from overlapcheck.core.batch import BatchInput

WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HostPlan:
    """The host's view of a batch's attention shape (FlashInfer's indptr arrays)."""

    qo_indptr: list[int]
    kv_indptr: list[int]  # in pages
    kv_lens: list[int]
    last_page_len: list[int]
    decode: bool

    @classmethod
    def of(cls, batch: BatchInput, page_size: int) -> HostPlan:
        qo, kv, lens, last = [0], [0], [], []
        for s in batch.seqs:
            pages = -(-s.end // page_size)
            qo.append(qo[-1] + s.end - s.start)
            kv.append(kv[-1] + pages)
            lens.append(s.end)
            last.append(s.end - (pages - 1) * page_size)
        # A verify batch (speculation) has several queries per sequence: a prefill for attention.
        decode = batch.phase == "decode" and not any(s.verify for s in batch.seqs)
        return cls(qo, kv, lens, last, decode=decode)


class TorchAttention:
    """Reference attention over gathered pages (CPU, float32): one sequence at a time."""

    def __init__(self, spec: ModelSpec, page_size: int) -> None:
        self.spec, self.page_size = spec, page_size
        self.plans: list[HostPlan | None] = [None, None]

    def plan(self, parity: int, batch: BatchInput) -> None:
        self.plans[parity] = HostPlan.of(batch, self.page_size)

    def bind(self, parity: int, kv_pages: torch.Tensor) -> _TorchBatch:
        plan = self.plans[parity]
        assert plan is not None, "plan before forward"
        ps = self.page_size
        offsets = torch.arange(ps, device=kv_pages.device)
        cells = []
        for b, kv_len in enumerate(plan.kv_lens):
            pages = kv_pages[plan.kv_indptr[b] : plan.kv_indptr[b + 1]].long()
            cells.append((pages[:, None] * ps + offsets).reshape(-1)[:kv_len])
        return _TorchBatch(self.spec, plan, cells)


class _TorchBatch:
    def __init__(self, spec: ModelSpec, plan: HostPlan, cells: list[torch.Tensor]) -> None:
        self.spec, self.plan, self.cells = spec, plan, cells

    def run(
        self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        s, plan = self.spec, self.plan
        k_flat = k_cache.view(-1, s.kv_heads, s.head_dim)
        v_flat = v_cache.view(-1, s.kv_heads, s.head_dim)
        group = s.heads // s.kv_heads
        out = []
        for b, cells in enumerate(self.cells):
            qb = q[plan.qo_indptr[b] : plan.qo_indptr[b + 1]].float()
            k = k_flat[cells].float().repeat_interleave(group, dim=1)
            v = v_flat[cells].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", qb, k) * s.head_dim**-0.5
            n_q, n_k = qb.shape[0], k.shape[0]
            # causal, aligned to the end: query i sits at position n_k - n_q + i
            allowed = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
            scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out.append(torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype))
        return torch.cat(out)


class FlashInferAttention:
    """FlashInfer wrappers, one prefill and one decode per parity, plus fixed-size decode wrappers
    for CUDA graphs (one per parity and batch size, created on demand)."""

    def __init__(
        self,
        spec: ModelSpec,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_pages: list[torch.Tensor],
    ) -> None:
        import flashinfer

        self.fi = flashinfer
        _pin_flashinfer_range_buffers()
        self.spec, self.page_size, self.dtype, self.device = spec, page_size, dtype, device
        self.kv_pages = kv_pages
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # fa2 on purpose: fa3 (the "auto" choice on Hopper) compiles for minutes on first use.
        self.prefill = [
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
            for _ in range(2)
        ]
        self.decode = [
            flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD") for _ in range(2)
        ]
        # FlashInfer's wrappers are untyped: Any.
        self.graph_decode: dict[tuple[int, int], Any] = {}
        self.active: list[Any] = [None, None]

    def plan(self, parity: int, batch: BatchInput, graph: bool = False) -> None:
        """Plan on the current stream (the scheduler stream)."""
        s, hp = self.spec, HostPlan.of(batch, self.page_size)
        i32 = torch.int32
        # NOTE: plan copies these to the device. From pageable memory that copy synchronises the
        # host with the stream (CUDA stages pageable H2D copies), a hidden host <- scheduler-stream
        # edge that serialises the overlap loop; pinned sources keep the copies asynchronous.
        kv_indptr = torch.tensor(hp.kv_indptr, dtype=i32).pin_memory()
        last = torch.tensor(hp.last_page_len, dtype=i32).pin_memory()
        indices = self.kv_pages[parity][: hp.kv_indptr[-1]]
        dtypes = dict(q_data_type=self.dtype, kv_data_type=self.dtype)
        if hp.decode and graph:
            wrapper = self.graph_wrapper(parity, len(batch.seqs))
            # The wrapper owns the indices buffer (ours); an empty tensor makes plan copy nothing.
            wrapper.plan(
                kv_indptr,
                indices[:0],
                last,
                s.heads,
                s.kv_heads,
                s.head_dim,
                self.page_size,
                **dtypes,
            )
        elif hp.decode:
            wrapper = self.decode[parity]
            wrapper.plan(
                kv_indptr, indices, last, s.heads, s.kv_heads, s.head_dim, self.page_size, **dtypes
            )
        else:
            wrapper = self.prefill[parity]
            qo_indptr = torch.tensor(hp.qo_indptr, dtype=i32).pin_memory()
            wrapper.plan(
                qo_indptr,
                kv_indptr,
                indices,
                last,
                s.heads,
                s.kv_heads,
                s.head_dim,
                self.page_size,
                causal=True,
                **dtypes,
            )
        self.active[parity] = wrapper

    def graph_wrapper(self, parity: int, batch_size: int) -> Any:
        key = (parity, batch_size)
        if key not in self.graph_decode:
            dev = self.device
            self.graph_decode[key] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=self.kv_pages[parity],
                paged_kv_last_page_len_buffer=torch.zeros(
                    batch_size, dtype=torch.int32, device=dev
                ),
            )
        return self.graph_decode[key]

    def bind(self, parity: int, kv_pages: torch.Tensor) -> _FlashInferBatch:
        wrapper = self.active[parity]
        assert wrapper is not None, "plan before forward"
        return _FlashInferBatch(wrapper)


class _FlashInferBatch:
    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def run(
        self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = self.wrapper.run(q, (k_cache, v_cache))
        return out


def _pin_flashinfer_range_buffers(largest: int = 1 << 14) -> None:
    """FlashInfer's decode plan builds its query indptr from a cached CPU `arange` and copies it to
    the device; that cache holds pageable tensors, whose copy would synchronise the host with the
    stream (see `plan`). Seed the cache with pinned ones. (FlashInfer 0.5: `utils._cache_buf`,
    keyed by ("range_<power of two>", device); absent in other versions, then nothing happens.)"""
    import flashinfer.utils as fi_utils

    cache = getattr(fi_utils, "_cache_buf", None)
    if not isinstance(cache, dict):
        return
    size = 1
    while size <= largest:
        cache[(f"range_{size}", "cpu")] = torch.arange(size, dtype=torch.int32).pin_memory()
        size *= 2
