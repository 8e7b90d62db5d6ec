"""What the scheduler hands the device for one forward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# What a batch holds, for the backends' choice of kernel and for the timeline's label:
# * "decode": every sequence has exactly one new token (`end - start == 1`); backends may take the
#   decode path (one query per sequence, CUDA graphs). The device rejects a decode batch of another
#   shape (`device-contract`).
# * "prefill": prompt chunks (a new prompt, its next chunk, or a recompute after preemption), any
#   number of new tokens per sequence.
# * "mixed": prompt chunks and decode steps in one forward (vLLM's one batch per iteration).
# Backends treat "prefill" and "mixed" alike (the general path); a scheduler may label any
# non-decode batch either way. Where each sample goes is `SeqWork.out_row/out_col`, never the phase.
Phase = Literal["prefill", "decode", "mixed"]
PHASES: tuple[Phase, ...] = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True)
class RowWrite:
    """Host values copied into `buffer[row, start:start + len(values)]` on the device."""

    row: int
    start: int
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One request's share of a forward.

    The forward reads input ids from `token_pool[slot, start:end]`, writes their KV into the cells
    `page_table[slot, start:end]` points at, attends over `page_table[slot, 0:end]`, samples from
    position `end - 1` and writes the sample into `token_pool[out_row, out_col]`.
    `kv_cells` is the host's copy of `page_table[slot, 0:end]`; backends use it for footprints only
    and read the real page table on the device.

    `verify`, `drafts`, `shift`, `source`: a speculative verify sequence, whose positions, inputs
    and outputs differ from the above (see `core/speculative.py`); the defaults are a plain one.
    """

    uid: int
    slot: int
    start: int
    end: int
    out_row: int
    out_col: int
    kv_cells: Sequence[int]
    verify: bool = False
    drafts: int = 0
    shift: int = 0
    source: int = -1

    @property
    def num_new_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class BatchInput:
    """A batch as the device sees it: an id (its label is `P3` or `D4`), a phase, its sequences."""

    batch_id: int
    phase: Phase
    seqs: tuple[SeqWork, ...]

    @property
    def label(self) -> str:
        return f"{_LABELS[self.phase]}{self.batch_id}"

    @property
    def uids(self) -> tuple[int, ...]:
        return tuple(s.uid for s in self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def num_context_tokens(self) -> int:
        return sum(s.end for s in self.seqs)

    def metadata(self, fields: int = 5) -> list[int]:
        """The attention/sampling metadata, flattened as it travels through the staging buffer:
        `fields` per sequence, 5 (`METADATA_FIELDS`) or, with speculation on, 8 (`SPEC_FIELDS`:
        the verify fields follow, the shift a placeholder where the device resolves it)."""
        flat: list[int] = []
        if fields == METADATA_FIELDS:
            for s in self.seqs:
                flat += [s.slot, s.start, s.end, s.out_row, s.out_col]
            return flat
        for s in self.seqs:
            shift = PLACEHOLDER if s.source >= 0 else 0
            flat += [s.slot, s.start, s.end, s.out_row, s.out_col, s.drafts, shift, s.source]
        return flat


METADATA_FIELDS = 5
_LABELS: dict[str, str] = {"prefill": "P", "decode": "D", "mixed": "M"}
SPEC_FIELDS = 8  # with speculation on: + drafts, the resolved shift, the placeholder's source
PLACEHOLDER = -1
"""The sentinel for a metadata value the host does not know at launch (see `core/speculative.py`):
the device must replace it before any forward reads it."""
