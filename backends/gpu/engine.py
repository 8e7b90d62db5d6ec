"""The forward as the device runs it: read the device buffers, run the model, sample, write back.

Everything here runs on the caller's current stream (the engine stream for `run`, the scheduler
stream for `plan`) and never waits for the host. Optionally, decode forwards replay CUDA graphs
(one per parity and batch size, captured up front by `capture`): a decode step then costs the host
one launch instead of hundreds, so the GPU, not Python, sets the pace and overlap can show.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from overlapcheck.backends.gpu import verify
from overlapcheck.backends.gpu.attention import FlashInferAttention, TorchAttention
from overlapcheck.backends.gpu.model import DecoderModel
from overlapcheck.backends.gpu.pools import Pools
from overlapcheck.backends.gpu.sampling import is_greedy, sample
from overlapcheck.core.batch import METADATA_FIELDS, BatchInput, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import SamplingParams
from overlapcheck.core.speculative import is_verify


class Engine:
    def __init__(
        self, model: DecoderModel, config: SchedulerConfig, flashinfer: bool, seed: int = 0
    ) -> None:
        self.model, self.config = model, config
        self.pools = Pools(config, model, model.device)
        self.attention: FlashInferAttention | TorchAttention
        if flashinfer:
            self.attention = FlashInferAttention(
                model.spec, config.page_size, model.dtype, model.device, self.pools.kv_pages
            )
        else:
            self.attention = TorchAttention(model.spec, config.page_size)
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._graph_planned = [False, False]

    def plan(self, batch: BatchInput, params: Sequence[SamplingParams | None]) -> None:
        """The attention plan of `batch` (host work plus H2D on the current stream)."""
        parity = batch.batch_id % 2
        use_graph = (
            batch.phase == "decode"
            and not is_verify(batch)
            and (parity, len(batch.seqs)) in self.graphs
            and is_greedy(params)
        )
        if isinstance(self.attention, FlashInferAttention):
            self.attention.plan(parity, batch, graph=use_graph)
        else:
            self.attention.plan(parity, batch)
        self._graph_planned[parity] = use_graph

    def run(self, batch: BatchInput, params: Sequence[SamplingParams | None]) -> torch.Tensor:
        """The forward of a planned batch; returns the samples as read back from `token_pool`."""
        parity, n = batch.batch_id % 2, len(batch.seqs)
        if is_verify(batch):
            return verify.forward(
                self.pools, self.model, self.attention, parity, batch, params, self.generator
            )
        if self._graph_planned[parity]:
            graph, out = self.graphs[(parity, n)]
            graph.replay()
            return out
        return self._forward(parity, n, batch.num_tokens, batch.phase == "decode", params)

    def _forward(
        self,
        parity: int,
        n: int,
        num_tokens: int,
        decode: bool,
        params: Sequence[SamplingParams | None],
    ) -> torch.Tensor:
        pools = self.pools
        idx = pools.index(parity, n, num_tokens, decode)
        attn = self.attention.bind(parity, pools.kv_pages[parity])
        logits = self.model.forward(idx.ids, idx.pos, idx.cells, idx.last, attn, pools.k, pools.v)
        tokens = sample(logits, params, self.generator)
        pools.token_storage.index_put_((idx.out,), tokens)
        # The D2H copies what token_pool holds at the sample cells, as the simulator does.
        sampled: torch.Tensor = pools.token_storage[idx.out]
        return sampled

    def resolve(self, batch: BatchInput) -> None:
        """`Device.resolve` on the current stream (see `verify.resolve`)."""
        verify.resolve(self.pools, batch, pinned=self.model.device.type == "cuda")

    def capture(self, batch_sizes: Iterable[int]) -> None:
        """Capture greedy decode graphs for these batch sizes (both parities), then reset the pools.

        Call before a run: capturing synchronises the device.
        """
        assert isinstance(self.attention, FlashInferAttention), "CUDA graphs need the CUDA engine"
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for n in sorted(set(batch_sizes)):
            if not 1 <= n <= self.config.num_slots:
                continue
            for parity in (0, 1):
                batch = _dummy_decode(parity, n, self.config)
                flat = torch.tensor(batch.metadata(self.pools.fields), dtype=torch.int32)
                self.pools.metadata[parity, : n * METADATA_FIELDS].copy_(flat)
                self.attention.plan(parity, batch, graph=True)
                greedy: list[SamplingParams | None] = [None] * n
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up outside capture, as torch recommends
                    self._forward(parity, n, n, True, greedy)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._forward(parity, n, n, True, greedy)
                self.graphs[(parity, n)] = (graph, out)
        torch.cuda.synchronize()
        self.pools.reset()
        torch.cuda.synchronize()


def _dummy_decode(parity: int, n: int, config: SchedulerConfig) -> BatchInput:
    seqs = tuple(
        SeqWork(
            uid=i,
            slot=i % config.num_slots,
            start=0,
            end=1,
            out_row=config.dummy_row,
            out_col=0,
            kv_cells=(0,),
        )
        for i in range(n)
    )
    return BatchInput(batch_id=2 + parity, phase="decode", seqs=seqs)
