"""The verify forward and the placeholder resolution on a torch device (`core/speculative.py`).

Shapes come from host ints only (how many sequences, new positions and drafts each has: the host
knows them even for a placeholder step); every position, input id, KV cell and output cell is
computed on the device from the device's metadata, token pool, draft rows and page table, so a
resolution that has not run, or ran late, shows as the wrong tokens it causes. Acceptance is
computed on the device too: nothing here waits for the host or makes the host wait.

Attention sees a verify batch as a prefill of `shift + drafts + 1` new positions per sequence
(causal, the queries at the end of the context): its plan needs host lengths only, so FlashInfer's
paged prefill wrapper runs it as planned on the scheduler stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from overlapcheck.backends.gpu.model import Attention, DecoderModel
from overlapcheck.backends.gpu.pools import GUARD, Pools
from overlapcheck.backends.gpu.sampling import sample
from overlapcheck.core.batch import SPEC_FIELDS, BatchInput
from overlapcheck.core.messages import SamplingParams
from overlapcheck.core.speculative import SHIFT_FIELD


class Binding(Protocol):
    """Paged attention as planned for a parity (`attention.py`)."""

    def bind(self, parity: int, kv_pages: torch.Tensor) -> Attention: ...


@dataclass(slots=True)
class VerifyIndex:
    ids: torch.Tensor  # input ids of every new position
    pos: torch.Tensor
    cells: torch.Tensor  # their KV cells
    last: torch.Tensor  # the rows whose logits verify: shift c .. c + drafts of each sequence
    out: torch.Tensor  # flat token-storage index of each verified row's output cell
    drafts: torch.Tensor  # the draft each verified row's output is compared with (-1: none)
    seq: torch.Tensor  # each verified row's sequence
    col: torch.Tensor  # and its place among that sequence's verified rows


def _owner(lengths: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of `total` flat rows, the sequence it belongs to and its offset in it, from
    per-sequence lengths on the device (no host sync: `total` is the host's count; garbled
    lengths give wrong owners, never an error)."""
    n = lengths.shape[0]
    cu = lengths.cumsum(0)
    t = torch.arange(total, device=lengths.device)
    seq = torch.searchsorted(cu, t, right=True).clamp(max=n - 1)
    return seq, t - (cu - lengths)[seq]


def index(pools: Pools, parity: int, batch: BatchInput) -> VerifyIndex:
    cfg, w, k = pools.config, pools.width, pools.draft_width
    n = len(batch.seqs)
    meta = pools.metadata[parity, : n * SPEC_FIELDS].view(n, SPEC_FIELDS).long()
    rows = meta[:, 0].remainder(cfg.num_slots)
    starts = meta[:, 1].clamp(0, w - 1)
    ends = meta[:, 2].clamp(1, w)
    m = meta[:, 5].clamp(0, k)
    lens = (ends - starts).clamp(min=1)
    # The resolved shift; a placeholder still there (or any value out of range) wraps into range,
    # as an out-of-bounds index reads some other cell on hardware, and as the simulator does.
    c = meta[:, SHIFT_FIELD].remainder((lens - m).clamp(min=1))
    seq, offset = _owner(lens, batch.num_tokens)
    first = lens.cumsum(0) - lens
    pos = (starts[seq] + offset).clamp(0, w - 1)
    base = GUARD + rows[seq] * w
    committed = offset <= c[seq]
    is_draft = (offset > c[seq]) & (offset <= c[seq] + m[seq])
    # committed positions read the token pool; padding reads the token at start + c
    token_at = torch.where(committed, pos, (starts + c)[seq].clamp(0, w - 1))
    draft_at = GUARD + rows[seq] * k + (offset - c[seq] - 1).clamp(0, k - 1)
    ids = torch.where(is_draft, pools.draft_storage[draft_at], pools.token_storage[base + token_at])
    ids = ids.long().remainder(pools.vocab_size)
    cells = pools.table_storage[base + pos].long().remainder(cfg.num_cells)
    pools.fill_pages(parity, rows, ends)
    vseq, j = _owner(m + 1, sum(s.drafts + 1 for s in batch.seqs))
    j = j.clamp(0, k)
    last = (first[vseq] + c[vseq] + j).clamp(0, batch.num_tokens - 1)
    out_rows = meta[:, 3].remainder(cfg.num_slots + 1)
    out = GUARD + out_rows[vseq] * w + (meta[:, 4][vseq] + c[vseq] + j).remainder(w)
    # the draft after verified row j is draft j (0-based); the last row has none
    draft_j = pools.draft_storage[GUARD + rows[vseq] * k + j.clamp(max=k - 1)].long()
    drafts = torch.where(j < m[vseq], draft_j, torch.full_like(draft_j, -1))
    return VerifyIndex(ids, pos, cells, last, out, drafts, vseq, j)


def forward(
    pools: Pools,
    model: DecoderModel,
    attention: Binding,
    parity: int,
    batch: BatchInput,
    params: Sequence[SamplingParams | None],
    generator: torch.Generator,
) -> torch.Tensor:
    """Run a planned verify batch; returns what its D2H copies: each sequence's drafts + 1
    output tokens, then each sequence's emitted count (int32)."""
    n = len(batch.seqs)
    idx = index(pools, parity, batch)  # fills the page indices: bind after it, as a forward does
    attn = attention.bind(parity, pools.kv_pages[parity])
    logits = model.forward(idx.ids, idx.pos, idx.cells, idx.last, attn, pools.k, pools.v)
    row_params = [p for s, p in zip(batch.seqs, params, strict=True) for _ in range(s.drafts + 1)]
    outputs = sample(logits, row_params, generator)
    # e = 1 + the leading verified rows whose output equals the draft after them
    agree = (outputs.long() == idx.drafts).to(torch.int32)
    width = pools.draft_width + 1
    table = torch.zeros((n, width), dtype=torch.int32, device=outputs.device)
    table[idx.seq, idx.col] = agree
    # leading agreements: where the running sum still equals the column count
    leading = table.cumsum(dim=1) == torch.arange(1, width + 1, device=outputs.device)
    counts = (leading.sum(dim=1) + 1).to(torch.int32)
    pools.token_storage.index_put_((idx.out,), outputs)
    pools.spec_out[parity, :n] = counts
    copied: torch.Tensor = torch.cat([pools.token_storage[idx.out], pools.spec_out[parity, :n]])
    return copied


def resolve(pools: Pools, batch: BatchInput, pinned: bool) -> None:
    """Each placeholder's shift from the previous batch's emitted counts, on the current stream.
    The cell indices are host ints, copied from pinned memory (a pageable source would make the
    host wait for the stream)."""
    parity = batch.batch_id % 2
    pairs = [(i, s.source) for i, s in enumerate(batch.seqs) if s.source >= 0]
    width = pools.metadata.shape[1]
    flat = [parity * width + i * SPEC_FIELDS + SHIFT_FIELD for i, _ in pairs]
    flat += [(1 - parity) * pools.spec_out.shape[1] + src for _, src in pairs]
    host = torch.tensor(flat, dtype=torch.int64)
    if pinned:
        host = host.pin_memory()
    cells = host.to(pools.metadata.device, non_blocking=True)
    meta_cells, src_cells = cells[: len(pairs)], cells[len(pairs) :]
    pools.metadata.view(-1)[meta_cells] = pools.spec_out.view(-1)[src_cells] - 1
