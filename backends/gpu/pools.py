"""The device buffers of the seam, and the forward's reads of them, as torch tensors.

`token_pool[num_slots + 1, max_seq_len]` (last row: the dummy row), `page_table[num_slots,
max_seq_len]` (KV cell per position), per-layer K/V pools of `num_pages * page_size` cells, the
metadata (two parity slots) and, per parity, the page indices the forward hands to attention.

Everything the forward reads it reads here, on its own stream, from the device copies: which
tokens (through the metadata), which cells (through the page table), where the sample goes. As on
the simulator, out-of-range values (stale or racing metadata) are wrapped into range rather than
trusted, so a scheduler bug shows up as wrong tokens or a race report, not as a device fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from overlapcheck.backends.gpu.model import DecoderModel
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.speculative import metadata_fields

# NOTE: the CUDA sanitizer keys accesses by a tensor's data pointer. The forward addresses the
# token pool and the page table through their whole storage, the scheduler stream writes row
# slices; one guard element before row 0 keeps a write at [0, 0] from sharing the whole storage's
# pointer, which the sanitizer would report as a race between disjoint cells. Cell-level conflicts
# are the footprint checker's job (`invariants/races.py`).
GUARD = 1


@dataclass(slots=True)
class ForwardIndex:
    """Where one forward reads and writes, computed on the device from the device buffers."""

    ids: torch.Tensor  # input token ids, one per new token
    pos: torch.Tensor  # their positions in the request
    cells: torch.Tensor  # the KV cells the page table gives those positions
    last: torch.Tensor  # per sequence: the row of its last new token (where it samples)
    out: torch.Tensor  # per sequence: flat index into the token storage of its sample's cell


class Pools:
    def __init__(self, config: SchedulerConfig, model: DecoderModel, device: torch.device) -> None:
        self.config = config
        w, rows = config.max_seq_len, config.num_slots + 1
        i32 = torch.int32
        self.width = w
        self.vocab_size = model.spec.vocab_size
        self.token_storage = torch.full((GUARD + rows * w,), -1, dtype=i32, device=device)
        self.token_pool = self.token_storage[GUARD:].view(rows, w)
        self.table_storage = torch.full(
            (GUARD + config.num_slots * w,), -1, dtype=i32, device=device
        )
        self.page_table = self.table_storage[GUARD:].view(config.num_slots, w)
        shape = model.kv_shape(config.num_pages, config.page_size)
        self.k = [torch.zeros(shape, dtype=model.dtype, device=device) for _ in model.layers]
        self.v = [torch.zeros(shape, dtype=model.dtype, device=device) for _ in model.layers]
        self.fields = metadata_fields(config)
        self.metadata = torch.full(
            (2, self.fields * (config.num_slots + 1)), -1, dtype=i32, device=device
        )
        # Speculation (core/speculative.py): drafts per slot (after a guard element, as above),
        # each verify sequence's emitted count per batch parity (-1: never written).
        self.draft_width = max(config.draft_tokens, 1)
        self.draft_storage = torch.zeros(
            (GUARD + config.num_slots * self.draft_width,), dtype=i32, device=device
        )
        self.draft_pool = self.draft_storage[GUARD:].view(config.num_slots, self.draft_width)
        self.spec_out = torch.full((2, config.num_slots + 1), -1, dtype=i32, device=device)
        self.max_pages = -(-w // config.page_size)  # pages a full row can hold
        lanes = config.num_slots * self.max_pages + 1  # + the trash lane
        self.kv_pages = [torch.zeros(lanes, dtype=i32, device=device) for _ in range(2)]

    def reset(self) -> None:
        """Back to the state of a fresh device (after warm-up runs)."""
        for t in (self.token_storage, self.table_storage, self.metadata, self.spec_out):
            t.fill_(-1)
        for t in (*self.k, *self.v, *self.kv_pages, self.draft_storage):
            t.zero_()

    def index(self, parity: int, n: int, num_tokens: int, decode: bool) -> ForwardIndex:
        """Read metadata slot `parity` (n sequences, `num_tokens` new tokens), gather inputs and
        fill this parity's page-index buffer. Shapes depend on host ints only (graph-capturable)."""
        cfg, w = self.config, self.width
        meta = self.metadata[parity, : n * self.fields].view(n, self.fields).long()
        rows = meta[:, 0].remainder(cfg.num_slots)
        starts, ends = meta[:, 1].clamp(0, w - 1), meta[:, 2].clamp(1, w)
        if decode:  # one new token per sequence
            seq, pos = torch.arange(n, device=meta.device), starts
            last = seq
        else:
            lens = (ends - starts).clamp(min=0)
            cu = lens.cumsum(0)
            t = torch.arange(num_tokens, device=meta.device)
            seq = torch.searchsorted(cu, t, right=True).clamp(max=n - 1)
            pos = (starts[seq] + t - (cu - lens)[seq]).clamp(0, w - 1)
            last = (cu - 1).clamp(0, num_tokens - 1)
        flat = GUARD + rows[seq] * w + pos
        ids = self.token_storage[flat].long().remainder(self.vocab_size)
        cells = self.table_storage[flat].long().remainder(cfg.num_cells)
        self._fill_pages(parity, rows, ends)
        out_rows = meta[:, 3].remainder(cfg.num_slots + 1)
        out = GUARD + out_rows * w + meta[:, 4].remainder(w)
        return ForwardIndex(ids, pos, cells, last, out)

    def fill_pages(self, parity: int, rows: torch.Tensor, ends: torch.Tensor) -> None:
        self._fill_pages(parity, rows, ends)

    def _fill_pages(self, parity: int, rows: torch.Tensor, ends: torch.Tensor) -> None:
        """Compact each sequence's pages, `page_table[row, 0:end:page_size] // page_size`, into
        the parity's page-index buffer at FlashInfer's kv_indptr offsets (fixed shapes)."""
        ps, buf = self.config.page_size, self.kv_pages[parity]
        j = torch.arange(self.max_pages, device=rows.device)
        npages = (ends + ps - 1) // ps
        first = npages.cumsum(0) - npages
        cells = self.table_storage[GUARD + rows[:, None] * self.width + j[None, :] * ps]
        pages = cells.long().remainder(self.config.num_cells) // ps
        trash = buf.shape[0] - 1  # lanes past a sequence's last page land here
        dest = torch.where(j[None, :] < npages[:, None], first[:, None] + j[None, :], trash)
        buf.index_put_((dest.reshape(-1).clamp(max=trash),), pages.reshape(-1).to(torch.int32))
