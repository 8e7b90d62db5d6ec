"""The stand-in for mini-sglang's `Engine`: the same attributes its scheduler reads, and a forward
that runs the simulator's toy model over the stand-in tensors instead of a real model.

What the scheduler gets is what upstream's engine gives it: an engine stream (current from now on,
as upstream sets it), a `page_table` of `max_running_req + 1` rows (the last for the dummy
request, pointed at a dummy page), the page count, `max_seq_len`, an attention backend whose
`prepare_metadata` stages per-batch metadata through pinned memory on the current stream, a graph
runner that never captures (a CUDA graph needs a real GPU), upstream's own `Sampler` for
`prepare`, and `forward_batch`. The forward is one kernel on the engine stream: it reads the
gathered input ids, positions, KV locations, the metadata, the page table rows and the KV cells of
each request's context, writes the new KV cells, and writes one sampled token per request into
`next_tokens_gpu`. Then, as upstream does: `complete_one()` for every request, a non-blocking copy
of the samples to pinned host memory, and `copy_done` recorded on the engine stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
from overlapcheck.backends.torchsim.dispatch import plain
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.backends.torchsim.tensor import SimTensor
from overlapcheck.core.config import SchedulerConfig


class StandInMetadata:
    """Per-batch attention metadata: query/key lengths through pinned memory, on the device."""

    def __init__(self, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor) -> None:
        self.cu_seqlens_q = cu_seqlens_q
        self.seq_lens = seq_lens

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1 : 1 + bs] - 1


class StandInAttention:
    """Prepares metadata as a paged-attention backend would (host lists -> pinned -> H2D on the
    current stream); capture and replay are never asked for (no CUDA graphs)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def prepare_metadata(self, batch: Any) -> None:
        reqs = batch.padded_reqs
        cu = [0]
        for req in reqs:
            cu.append(cu[-1] + req.extend_len)
        host_q = torch.tensor(cu, dtype=torch.int32, pin_memory=True)
        host_k = torch.tensor([r.device_len for r in reqs], dtype=torch.int32, pin_memory=True)
        batch.attn_metadata = StandInMetadata(
            host_q.to(self.device, non_blocking=True), host_k.to(self.device, non_blocking=True)
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        raise NotImplementedError("CUDA graphs need a real GPU")

    def prepare_for_capture(self, batch: Any) -> None:
        raise NotImplementedError("CUDA graphs need a real GPU")

    def prepare_for_replay(self, batch: Any) -> None:
        raise NotImplementedError("CUDA graphs need a real GPU")


class NoGraphs:
    """mini-sglang's graph runner with graphs disabled: no padding, never a replay."""

    max_graph_bs = 0

    def can_use_cuda_graph(self, batch: Any) -> bool:
        return False

    def pad_batch(self, batch: Any) -> None:
        batch.padded_reqs = batch.reqs

    def destroy_cuda_graphs(self) -> None:
        return None


class EngineParts:
    """What a stand-in engine is built from (the adapter makes one per run)."""

    def __init__(
        self, config: SchedulerConfig, cuda: SimulatedCuda, model: ToyModel, upstream: Any
    ) -> None:
        self.config = config
        self.cuda = cuda
        self.model = model
        self.upstream = upstream  # mini-sglang's modules by name (checkout.load)
        self.batches = 0
        # Each launched batch's id in the trace, by the Batch object (alive until processed).
        self.batch_ids: dict[int, tuple[int, str]] = {}


def make_engine_class(parts: EngineParts) -> Callable[[Any], Any]:
    """A class with `Engine(config)`'s signature, bound to one run's parts."""

    class StandInEngine:
        def __init__(self, config: Any) -> None:
            cfg = parts.config
            up = parts.upstream
            self.device = parts.cuda.torch_device
            self.stream = torch.cuda.Stream()
            torch.cuda.set_stream(self.stream)
            self.dtype = torch.int32
            self.ctx = up["minisgl.core"].Context(cfg.page_size)
            up["minisgl.core"].set_global_ctx(self.ctx)
            self.tp_cpu_group = None
            self.num_pages = cfg.num_pages
            self.max_seq_len = cfg.max_seq_len
            num_tokens = cfg.num_pages * cfg.page_size
            self.kv = torch.full(
                (num_tokens + cfg.page_size,), -1, dtype=torch.int32, device=self.device
            )
            parts.cuda.name(self.kv, "kv")
            self.ctx.page_table = self.page_table = torch.zeros(
                (config.max_running_req + 1, cfg.max_seq_len),
                dtype=torch.int32,
                device=self.device,
            )
            parts.cuda.name(self.page_table, "page_table")
            self.ctx.attn_backend = self.attn_backend = StandInAttention(self.device)
            self.sampler = up["minisgl.engine.sample"].Sampler(self.device, cfg.vocab_size)
            self.dummy_req = up["minisgl.core"].Req(
                input_ids=torch.tensor([0], dtype=torch.int32, device="cpu"),
                table_idx=config.max_running_req,
                cached_len=0,
                output_len=1,
                uid=-1,
                sampling_params=None,
                cache_handle=None,
            )
            self.page_table[self.dummy_req.table_idx].fill_(num_tokens)
            self.graph_runner = NoGraphs()
            # Upstream's engine ends its set-up by measuring free memory, which synchronizes the
            # device (`_sync_get_memory`): nothing it issued is still running when it returns.
            torch.cuda.synchronize(self.device)

        def forward_batch(self, batch: Any, args: Any) -> Any:
            assert torch.cuda.current_stream() == self.stream
            parts.batches += 1
            label = f"{'P' if batch.is_prefill else 'D'}{parts.batches}"
            parts.batch_ids[id(batch)] = (parts.batches, label)
            tokens = torch.empty(batch.size, dtype=torch.int32, device=self.device)
            assert isinstance(tokens, SimTensor)
            _launch_forward(parts, self, batch, tokens, parts.batches)
            for req in batch.reqs:
                req.complete_one()
            next_tokens_cpu = tokens.to("cpu", non_blocking=True)
            copy_done = torch.cuda.Event()
            copy_done.record(self.stream)
            return parts.upstream["minisgl.engine"].ForwardOutput(
                tokens, next_tokens_cpu, copy_done
            )

        def shutdown(self) -> None:
            return None

    return StandInEngine


def _launch_forward(
    parts: EngineParts, engine: Any, batch: Any, tokens: SimTensor, batch_id: int
) -> None:
    """The model as one kernel on the current (engine) stream, over what the batch names."""
    cuda, model = parts.cuda, parts.model
    reqs = list(batch.reqs)
    width = engine.page_table.shape[1]
    rows = [int(r.table_idx) for r in reqs]
    ends = [int(r.device_len) for r in reqs]
    begins = [int(r.cached_len) for r in reqs]
    table: SimTensor = engine.page_table
    kv: SimTensor = engine.kv
    inputs, out_loc = batch.input_ids, batch.out_loc
    meta = batch.attn_metadata
    with plain():
        table_cells = np.concatenate(
            [
                np.arange(row * width, row * width + end, dtype=np.int64)
                for row, end in zip(rows, ends, strict=True)
            ]
        )
        kv_of_table = (
            table.logic.reshape(-1)[torch.from_numpy(table_cells)].numpy().astype(np.int64)
        )
        kv_cells = np.mod(kv_of_table, kv.numel())
        written = np.mod(out_loc.logic.numpy().astype(np.int64), kv.numel())
    accesses: list[tuple[torch.Tensor, np.ndarray | None, str]] = [
        (inputs, None, "r"),
        (batch.positions, None, "r"),
        (out_loc, None, "r"),
        (meta.cu_seqlens_q, None, "r"),
        (meta.seq_lens, None, "r"),
        (table, table_cells, "r"),
        (kv, kv_cells, "r"),
        (kv, written, "w"),
        (tokens, None, "w"),
    ]
    timing = parts.cuda.device.timing
    new_tokens = sum(e - b for b, e in zip(begins, ends, strict=True))
    cost = timing.forward(new_tokens, sum(ends))
    phase = "prefill" if batch.is_prefill else "decode"
    label = f"{'P' if phase == 'prefill' else 'D'}{batch_id}"

    def compute(
        pool: torch.Tensor, table_values: torch.Tensor, ids: torch.Tensor, loc: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Next tokens from what the kernel reads: each request's context is its cached KV
        through its page-table row, then its new input ids."""
        kv_all = pool.numpy()
        table_np = table_values.reshape(-1).numpy()
        ids_np = ids.numpy()
        out = np.empty(len(reqs), dtype=DTYPE)
        offset = 0
        for i, (row, begin, end) in enumerate(zip(rows, begins, ends, strict=True)):
            cells = np.mod(
                table_np[row * width : row * width + begin].astype(np.int64), len(kv_all)
            )
            new = ids_np[offset : offset + end - begin]
            offset += end - begin
            context = np.concatenate([kv_all[cells], new]).astype(DTYPE)
            out[i] = model.next_token_of(context.tobytes())
        return out, np.mod(loc.numpy().astype(np.int64), len(kv_all)), ids_np.astype(DTYPE)

    # program order: the logical copies get the same computation at issue
    with plain():
        logical_tokens, logical_loc, logical_ids = compute(
            kv.logic, table.logic, inputs.logic, out_loc.logic
        )
        kv.logic[torch.from_numpy(logical_loc)] = torch.from_numpy(logical_ids)
        tokens.logic.copy_(torch.from_numpy(logical_tokens))
    # what the kernel runs on: the physical copies, not the program's tensors (it drops them when
    # it likes; the allocator decides what happens to their memory)
    kv_phys, table_phys, inputs_phys, loc_phys = kv.phys, table.phys, inputs.phys, out_loc.phys
    tokens_phys = tokens.phys

    def start() -> Callable[[], None]:
        with plain():
            values, loc, ids = compute(kv_phys, table_phys, inputs_phys, loc_phys)

        def end() -> None:
            with plain():
                kv_phys[torch.from_numpy(loc)] = torch.from_numpy(ids)
                tokens_phys.copy_(torch.from_numpy(values))

        return end

    uids = tuple(int(r.uid) for r in reqs)
    cuda.launch("forward", label, accesses, cost, start, batch=batch_id, uids=uids)
