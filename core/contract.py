"""The device seam's argument checks: a scheduler that hands the device a malformed batch or copy
broke the contract. That is the scheduler's bug (`device-contract`), not a crash of the device
(which would be blamed on overlapcheck). Both devices call these before touching a buffer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from overlapcheck.core.batch import BatchInput, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import KvCopy
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.trace import DRAFT_POOL, PAGE_TABLE, TOKEN_POOL

DEVICE_CONTRACT = "device-contract"


class ContractError(InvariantError):
    """The scheduler called the device with arguments outside the contract."""

    def __init__(self, message: str) -> None:
        super().__init__(DEVICE_CONTRACT, message)


def check_batch_size(config: SchedulerConfig, batch: BatchInput) -> None:
    """A batch fits the metadata buffers: between one sequence and one per slot."""
    if not batch.seqs:
        raise ContractError(f"batch {batch.label} has no sequences")
    if len(batch.seqs) > config.num_slots:
        raise ContractError(
            f"batch {batch.label} has {len(batch.seqs)} sequences, {config.num_slots} slots"
        )


def check_batch(config: SchedulerConfig, batch: BatchInput) -> None:
    """Every sequence inside the pools: rows, positions, sample cell, enough KV cells; one row
    each. The KV cells' values are checked by `check_kv_cells`, on the array the footprints
    already made of them (a scan per sequence here was a tenth of a simulated iteration)."""
    check_batch_size(config, batch)
    seqs = batch.seqs
    # (a verify step of speculative decoding is a decode step of several new positions: its
    # shape rules are `core/speculative.py`'s)
    decode = batch.phase == "decode" and not any(s.verify for s in batch.seqs)
    slots = [s.slot for s in seqs]
    if len(set(slots)) != len(slots):
        raise ContractError(f"batch {batch.label} uses a slot twice: {slots}")
    width, num_slots, dummy = config.max_seq_len, config.num_slots, config.dummy_row
    for s in seqs:
        if not 0 <= s.slot < num_slots:
            raise ContractError(f"{_where(batch, s)}: slot {s.slot} outside 0..{num_slots - 1}")
        if not 0 <= s.start < s.end <= width:
            raise ContractError(
                f"{_where(batch, s)}: positions {s.start}..{s.end} (need 0 <= start < end <= "
                f"{width})"
            )
        if decode and s.end - s.start != 1:
            raise ContractError(
                f"{_where(batch, s)}: {s.end - s.start} new tokens in a decode batch (one each; "
                "label it prefill or mixed)"
            )
        if not (0 <= s.out_row <= dummy and 0 <= s.out_col < width):
            raise ContractError(
                f"{_where(batch, s)}: sample cell ({s.out_row}, {s.out_col}) outside the token pool"
            )
        if len(s.kv_cells) < s.end:
            raise ContractError(
                f"{_where(batch, s)}: {len(s.kv_cells)} KV cells for {s.end} positions"
            )


def check_kv_cells(config: SchedulerConfig, batch: BatchInput, context: np.ndarray) -> None:
    """The KV cells the batch reads (`kv_cells[:end]` of each sequence, concatenated in order)
    are all inside the KV pool."""
    cells = config.num_cells
    if not len(context) or (context.min() >= 0 and context.max() < cells):
        return
    bad = int(np.flatnonzero((context < 0) | (context >= cells))[0])
    ends = np.cumsum([s.end for s in batch.seqs])
    seq = batch.seqs[int(np.searchsorted(ends, bad, side="right"))]
    raise ContractError(f"{_where(batch, seq)}: a KV cell outside 0..{cells - 1}")


def _where(batch: BatchInput, seq: SeqWork) -> str:
    return f"batch {batch.label}, request {seq.uid}"


def check_kv_copy(config: SchedulerConfig, saved: KvCopy, cells: Sequence[int]) -> None:
    """A KV copy moves as many cells as its host buffer holds, all inside the KV pool."""
    if len(cells) != saved.length:
        raise ContractError(
            f"KV copy kv{saved.id} of {saved.length} cells given {len(cells)} cells (request "
            f"{saved.uid})"
        )
    if cells and not (min(cells) >= 0 and max(cells) < config.num_cells):
        raise ContractError(f"KV copy kv{saved.id}: a KV cell outside 0..{config.num_cells - 1}")


def check_rows(config: SchedulerConfig, buffer: str, writes: Sequence[RowWrite]) -> None:
    """A host-to-device copy lands inside its buffer, with values the buffer can hold."""
    if buffer == TOKEN_POOL:
        rows, top, what = config.dummy_row + 1, config.vocab_size, "token id"
    elif buffer == PAGE_TABLE:
        rows, top, what = config.num_slots, config.num_cells, "KV cell"
    elif buffer == DRAFT_POOL and config.draft_tokens:
        rows, top, what = config.num_slots, config.vocab_size, "draft token id"
    else:
        raise ContractError(
            f"copy_to_device into {buffer!r}: only {TOKEN_POOL}, {PAGE_TABLE} and, with "
            f"draft_tokens > 0, {DRAFT_POOL}"
        )
    width = config.draft_tokens if buffer == DRAFT_POOL else config.max_seq_len
    for w in writes:
        if not 0 <= w.row < rows:
            raise ContractError(f"copy into {buffer} row {w.row}, which has rows 0..{rows - 1}")
        if not (w.start >= 0 and w.start + len(w.values) <= width):
            raise ContractError(
                f"copy into {buffer}[{w.row}, {w.start}:{w.start + len(w.values)}] past the row "
                f"of {width}"
            )
        if w.values and not (min(w.values) >= 0 and max(w.values) < top):
            raise ContractError(f"copy into {buffer} of a {what} outside 0..{top - 1}")
