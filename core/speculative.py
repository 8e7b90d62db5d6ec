"""Speculative decoding at the device seam: steps that emit several tokens, and placeholders.

With `SchedulerConfig.draft_tokens` = k > 0 a decode sequence may be a *verify* sequence
(`SeqWork.verify`). The host drafts up to k tokens per sequence (any way it likes: the reference
scheduler looks them up in the request's own context), the device runs the model over them and
keeps the prefix the model agrees with, plus one token of its own. With k = 0 nothing here applies
and the seam is exactly the one-token-per-step seam of `core/device.py`.

The contract of one verify sequence `s` of batch B (positions are columns of the slot's row):

* Shape, known to the host at launch: new positions `[s.start, s.end)` with
  `s.end = s.start + s.shift + s.drafts + 1`; `s.out_row = s.slot`, `s.out_col = s.start + 1`.
  The forward attends over `page_table[slot, 0:end]` and writes the KV of every new position.
* The resolved shift c, 0 <= c <= `s.shift`: of the new positions, `start..start+c` hold committed
  tokens (the forward reads them from `token_pool`), `start+c+1 .. start+c+drafts` the drafts (read
  from `draft_pool[slot, 0:drafts]`); the rest, `shift - c` of them, is padding (their input is the
  token at `start + c`; their outputs are thrown away). With `s.shift = 0`, c = 0.
* Placeholders: a host that launches B while the request's previous step (in batch B - 1, as its
  sequence `s.source`) has not been processed does not know how many tokens that step emitted, so
  it does not know c. It sets `s.shift` to the most that step can add past its first token (its
  drafts), `s.source` to the sequence's index in batch B - 1, and the metadata carries
  `PLACEHOLDER` (-1) as c. `Device.resolve(B, stream)` replaces it on the device: c = (what
  `spec_out` holds for batch B - 1's sequence `source`) - 1. The footprint of `resolve` reads that
  `spec_out` cell and writes B's metadata: the resolution must run after the forward of B - 1 (on
  the same stream, or after an event recorded after it) and after B's metadata copy, and before
  B's forward. A forward that finds a PLACEHOLDER still in its metadata has a placeholder in its
  input: that is the scheduler's bug, and a backend reads whatever index wraps into range, as
  hardware would.
* Verification: the model's next token after each of the positions `start+c .. start+c+drafts`,
  o_0 .. o_drafts (sampled as any forward samples; greedy in the simulator). The step accepts the
  longest prefix of the drafts equal to o_0 .. o_(j-1) and emits e = j + 1 tokens, o_0 .. o_j
  (1 <= e <= drafts + 1): exactly the tokens a one-token-per-step run would produce. It writes
  every o_t into `token_pool[slot, out_col + c + t]` (t = 0..drafts: only the first e count; the
  rest sit in cells that the next step overwrites before reading) and e into
  `spec_out[B % 2, i]` (i: the sequence's index in B). After the step the request's committed
  length is `start + c + e + 1`; the KV of positions `>= start + c + e` is not committed (a
  rejected draft's, or padding's), and the next step must recompute it before reading it.
* Output: the D2H after the forward copies each sequence's `drafts + 1` tokens from `token_pool`
  and its e from `spec_out` into the forward's pinned host buffer; `ForwardOutput.emitted()`
  returns the first e tokens of each sequence, valid only after the host waited on an event
  recorded after the forward (as for `tokens()`).
* Drafts live in `draft_pool[num_slots, k]`, one row per slot, copied in with `copy_to_device` on a
  stream of the scheduler's choice. The forward reads the row when it runs: the host must not
  copy a new draft row until the forward that reads the old one has run (an event recorded after
  that forward), or the forward may read the next step's drafts. A wrong draft never changes what
  is emitted, only how much.

A batch with verify sequences is a decode batch of verify sequences only, at most one per slot.
Metadata with speculation on has `SPEC_FIELDS` (8) fields per sequence, for every batch.

Drafters. How a scheduler drafts is its own business; one that drafts through a `Drafter` (a
`DraftQuery` per step: the request, the batch the drafts are for, what the host knows and
assumes) and takes another one (`TakesDrafter`, the optional capability) can be replayed on any
engine with the recorded acceptance: a replay hands it drafts made to agree with that engine's
own tokens exactly as far as the recorded step accepted (`replay/drafts.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from overlapcheck.core.batch import (
    METADATA_FIELDS,
    PLACEHOLDER,
    SPEC_FIELDS,
    BatchInput,
    SeqWork,
)
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.contract import ContractError
from overlapcheck.core.trace import DRAFT_POOL, SPEC_OUT

SHIFT_FIELD = 6  # the metadata field `resolve` writes

__all__ = [
    "DRAFT_POOL",
    "PLACEHOLDER",
    "SHIFT_FIELD",
    "SPEC_OUT",
    "DraftQuery",
    "Drafter",
    "TakesDrafter",
    "accepted",
    "is_verify",
]


class DraftQuery(NamedTuple):
    """What a scheduler asks its drafter for one verify step of one request.

    The drafts are for the positions after `known` + `assumed` + `skip` tokens: `known` are the
    prompt and the outputs the host has (its context), `assumed` tokens it takes to follow them
    without knowing (the in-flight step's drafts, guessed accepted), `skip` tokens after those it
    does not know at all (the in-flight step's own token). Up to `wanted` of them."""

    uid: int
    batch_id: int  # the batch the drafts are for
    known: tuple[int, ...]
    assumed: tuple[int, ...]
    skip: int
    wanted: int


class Drafter(Protocol):
    def draft(self, query: DraftQuery) -> list[int]:
        """At most `query.wanted` draft tokens (fewer, or none, is always allowed)."""
        ...


@runtime_checkable
class TakesDrafter(Protocol):
    """The optional capability: the scheduler drafts with the drafter it is given (before its
    first step) instead of its own."""

    def use_drafter(self, drafter: Drafter) -> None: ...


def metadata_fields(config: SchedulerConfig) -> int:
    """Metadata fields per sequence: the verify fields are there whenever speculation is on."""
    return SPEC_FIELDS if config.draft_tokens > 0 else METADATA_FIELDS


def is_verify(batch: BatchInput) -> bool:
    return bool(batch.seqs) and batch.seqs[0].verify


def has_placeholders(batch: BatchInput) -> bool:
    return any(s.source >= 0 for s in batch.seqs)


def accepted(drafts: Sequence[int], outputs: Sequence[int]) -> int:
    """Tokens a verify step emits: the drafts the model agrees with, in order, plus one.
    `outputs[t]` is the model's token after the t-th verified position (len(drafts) + 1 of them)."""
    j = 0
    while j < len(drafts) and drafts[j] == outputs[j]:
        j += 1
    return j + 1


def output_size(batch: BatchInput) -> int:
    """Cells of a verify batch's pinned host buffer: each sequence's tokens, then each e."""
    return sum(s.drafts + 1 for s in batch.seqs) + len(batch.seqs)


def parse_output(batch: BatchInput, flat: Sequence[int]) -> list[list[int]]:
    """The emitted tokens of each sequence, from a verify batch's host buffer. A count outside
    1..drafts+1 (the buffer read before the copy landed) gives what the buffer holds, cut to
    that range, so a too-early read shows as wrong tokens, never as an exception."""
    n = len(batch.seqs)
    counts = flat[len(flat) - n :]
    out, at = [], 0
    for s, e in zip(batch.seqs, counts, strict=True):
        width = s.drafts + 1
        out.append(list(flat[at : at + min(max(int(e), 1), width)]))
        at += width
    return out


def check_verify(config: SchedulerConfig, batch: BatchInput) -> None:
    """A verify batch keeps the shape rules above (raises `device-contract`)."""
    k, width = config.draft_tokens, config.max_seq_len
    if k == 0:
        raise ContractError(f"batch {batch.label} verifies drafts with draft_tokens 0")
    if batch.phase != "decode" or not all(s.verify for s in batch.seqs):
        raise ContractError(f"batch {batch.label} mixes verify and other sequences")
    for s in batch.seqs:
        where = f"batch {batch.label}, request {s.uid}"
        if not (0 <= s.drafts <= k and 0 <= s.shift <= k):
            raise ContractError(f"{where}: {s.drafts} drafts, shift {s.shift} (k = {k})")
        if s.end != s.start + s.shift + s.drafts + 1 or s.end >= width:
            raise ContractError(
                f"{where}: positions {s.start}..{s.end} for shift {s.shift} and {s.drafts} "
                f"drafts (need end = start + shift + drafts + 1 < {width})"
            )
        if s.out_row != s.slot or s.out_col != s.start + 1:
            raise ContractError(f"{where}: a verify step samples into its own row after start")
        if (s.source >= 0) != (s.shift > 0) or s.source > config.num_slots:
            raise ContractError(f"{where}: shift {s.shift} with placeholder source {s.source}")


def check_plain(batch: BatchInput) -> None:
    """A batch without verify sequences carries no verify fields."""
    for s in batch.seqs:
        if s.drafts or s.shift or s.source >= 0:
            raise ContractError(
                f"batch {batch.label}, request {s.uid}: verify fields on a plain sequence"
            )


# -- footprints: which cells a verify forward, its resolution and its D2H touch ----------------


def _span(row: int, width: int, start: int, stop: int) -> np.ndarray:
    return np.arange(row * width + start, row * width + stop, dtype=np.int64)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def spec_out_cells(parity: int, indices: Sequence[int], num_slots: int) -> np.ndarray:
    base = parity * (num_slots + 1)
    return np.fromiter((base + i for i in indices), np.int64, len(indices))


def verify_cells(seqs: Sequence[SeqWork], width: int, k: int) -> dict[str, np.ndarray]:
    """The verify forward's cells per buffer and mode: `tokens_r` (committed inputs: any of the
    first shift + 1 new positions), `drafts_r`, `table_r` and `context` (`[0, end)` of each
    sequence, concatenated in order), `kv_w` (the new positions), `tokens_w` (every cell a
    resolved shift may put an output in)."""
    tokens_r, drafts_r, table_r, kv_w, tokens_w = [], [], [], [], []
    context: list[np.ndarray] = []
    for s in seqs:
        tokens_r.append(_span(s.slot, width, s.start, s.start + s.shift + 1))
        drafts_r.append(_span(s.slot, k, 0, s.drafts))
        table_r.append(_span(s.slot, width, 0, s.end))
        cells = np.fromiter(s.kv_cells[: s.end], np.int64, s.end)
        context.append(cells)
        kv_w.append(cells[s.start : s.end])
        tokens_w.append(_span(s.out_row, width, s.out_col, s.end + 1))
    return {
        "tokens_r": _cat(tokens_r),
        "drafts_r": _cat(drafts_r),
        "table_r": _cat(table_r),
        "context": _cat(context),
        "kv_w": _cat(kv_w),
        "tokens_w": _cat(tokens_w),
    }


def shift_cells(batch: BatchInput, metadata_width: int) -> np.ndarray:
    """The metadata cells `resolve` writes: the shift field of each placeholder sequence."""
    base = (batch.batch_id % 2) * metadata_width
    idx = [i for i, s in enumerate(batch.seqs) if s.source >= 0]
    return np.fromiter((base + i * SPEC_FIELDS + SHIFT_FIELD for i in idx), np.int64, len(idx))
