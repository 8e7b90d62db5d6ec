"""The device seam's argument checks: a scheduler that hands the device a malformed batch or copy
broke the contract. That is the scheduler's bug (`device-contract`), not a crash of the device
(which would be blamed on overlapcheck). Both devices call these before touching a buffer."""

from __future__ import annotations

from collections.abc import Sequence

from overlapcheck.core.batch import BatchInput, RowWrite
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.trace import PAGE_TABLE, TOKEN_POOL

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
    """Every sequence inside the pools: rows, positions, sample cell, KV cells; one row each."""
    check_batch_size(config, batch)
    seqs = batch.seqs
    slots = [s.slot for s in seqs]
    if len(set(slots)) != len(slots):
        raise ContractError(f"batch {batch.label} uses a slot twice: {slots}")
    width, cells = config.max_seq_len, config.num_cells
    for s in seqs:
        where = f"batch {batch.label}, request {s.uid}"
        if not 0 <= s.slot < config.num_slots:
            raise ContractError(f"{where}: slot {s.slot} outside 0..{config.num_slots - 1}")
        if not 0 <= s.start < s.end <= width:
            raise ContractError(
                f"{where}: positions {s.start}..{s.end} (need 0 <= start < end <= {width})"
            )
        if not (0 <= s.out_row <= config.dummy_row and 0 <= s.out_col < width):
            raise ContractError(
                f"{where}: sample cell ({s.out_row}, {s.out_col}) outside the token pool"
            )
        if len(s.kv_cells) < s.end:
            raise ContractError(f"{where}: {len(s.kv_cells)} KV cells for {s.end} positions")
        used = s.kv_cells[: s.end]
        if used and not (min(used) >= 0 and max(used) < cells):
            raise ContractError(f"{where}: a KV cell outside 0..{cells - 1}")


def check_rows(config: SchedulerConfig, buffer: str, writes: Sequence[RowWrite]) -> None:
    """A host-to-device copy lands inside its buffer, with values the buffer can hold."""
    if buffer == TOKEN_POOL:
        rows, top, what = config.dummy_row + 1, config.vocab_size, "token id"
    elif buffer == PAGE_TABLE:
        rows, top, what = config.num_slots, config.num_cells, "KV cell"
    else:
        raise ContractError(f"copy_to_device into {buffer!r}: only {TOKEN_POOL} and {PAGE_TABLE}")
    for w in writes:
        if not 0 <= w.row < rows:
            raise ContractError(f"copy into {buffer} row {w.row}, which has rows 0..{rows - 1}")
        if not (w.start >= 0 and w.start + len(w.values) <= config.max_seq_len):
            raise ContractError(
                f"copy into {buffer}[{w.row}, {w.start}:{w.start + len(w.values)}] past the row "
                f"of {config.max_seq_len}"
            )
        if w.values and not (min(w.values) >= 0 and max(w.values) < top):
            raise ContractError(f"copy into {buffer} of a {what} outside 0..{top - 1}")
