"""The simulated verify forward (`core/speculative.py`): what its kernel reads when it starts and
what it writes when it ends, from the device buffers as they are at those moments.

Verify batches are small (a sequence per slot, a few positions each), so this loops over
sequences; the model is still called once per verified position, on the context the kernel read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
from overlapcheck.core.batch import SPEC_FIELDS
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.speculative import SHIFT_FIELD, accepted


@dataclass(slots=True)
class Buffers:
    """The simulated device's buffers a verify forward touches."""

    token_pool: np.ndarray
    page_table: np.ndarray
    kv: np.ndarray
    metadata: np.ndarray
    draft_pool: np.ndarray
    spec_out: np.ndarray


@dataclass(slots=True)
class VerifyPlan:
    """The kernel's writes, decided from what it read at its start."""

    kv_cells: np.ndarray
    kv_ids: np.ndarray
    out_rows: np.ndarray
    out_cols: np.ndarray
    out_tokens: np.ndarray
    counts: np.ndarray
    emitted: tuple[tuple[int, ...], ...]
    firsts: tuple[int, ...]  # each sequence's first draft position (start + resolved shift + 1)
    drafts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Row:
    """One sequence's fields as the kernel (or the D2H after it) reads them from the metadata."""

    slot: int
    start: int
    end: int
    out_row: int
    out_col: int
    drafts: int
    shift: int  # resolved, wrapped into range
    raw_shift: int  # as read: PLACEHOLDER (or any value out of range) was never resolved

    @property
    def resolved(self) -> bool:
        return self.shift == self.raw_shift


def rows(config: SchedulerConfig, metadata: np.ndarray, parity: int, n: int) -> list[Row]:
    """Each sequence's fields; out-of-range values wrap into range, as an out-of-bounds index on
    hardware reads some other cell rather than stopping."""
    meta = metadata[parity, : n * SPEC_FIELDS].reshape(n, SPEC_FIELDS).tolist()
    width, k = config.max_seq_len, config.draft_tokens
    out = []
    for slot, start, end, out_row, out_col, drafts, shift, _ in meta:
        start = min(max(start, 0), width - 1)
        end = min(max(end, start + 1), width)
        drafts = min(max(drafts, 0), k, end - start - 1)
        span = end - start - drafts  # the committed positions a shift may cover, + 1
        out.append(
            Row(
                slot % config.num_slots,
                start,
                end,
                out_row % (config.num_slots + 1),
                out_col % width,
                drafts,
                shift % span,
                shift,
            )
        )
    return out


def read(
    config: SchedulerConfig,
    model: ToyModel,
    buf: Buffers,
    parity: int,
    n: int,
    op: int,
    shadow: KvShadow | None,
) -> tuple[VerifyPlan, list[tuple[int, int]]]:
    """The kernel's reads at its start and the writes they decide; with the sequences (index,
    value read) whose shift was still a placeholder."""
    seqs = rows(config, buf.metadata, parity, n)
    width, cells = config.max_seq_len, len(buf.kv)
    used = max(r.end for r in seqs)
    tables = np.zeros((n, used), dtype=np.int64)
    cached = np.zeros((n, used), dtype=DTYPE)
    fresh = np.zeros((n, used), dtype=DTYPE)
    kv_cells, kv_ids, out_rows, out_cols, out_tokens = [], [], [], [], []
    counts, emitted, unresolved = [], [], []
    for i, r in enumerate(seqs):
        if not r.resolved:
            unresolved.append((i, r.raw_shift))
        table = buf.page_table[r.slot, : r.end] % cells
        tables[i, : r.end] = table
        cached[i, : r.end] = buf.kv[table]
        row = buf.token_pool[r.slot, : r.end].copy()
        c, m = r.shift, r.drafts
        ids = np.empty(r.end - r.start, dtype=DTYPE)
        ids[: c + 1] = buf.token_pool[r.slot, r.start : r.start + c + 1]
        ids[c + 1 : c + 1 + m] = buf.draft_pool[r.slot, :m]
        ids[c + 1 + m :] = ids[c]  # padding: the token at start + c
        row[r.start :] = ids
        fresh[i, : r.end] = row
        context = np.concatenate([cached[i, : r.start], ids])
        outputs = [
            model.next_token_of(context[: r.start + c + 1 + t].tobytes()) for t in range(m + 1)
        ]
        e = accepted(ids[c + 1 : c + 1 + m].tolist(), outputs)
        kv_cells.append(table[r.start :])
        kv_ids.append(ids)
        cols = [(r.out_col + c + t) % width for t in range(m + 1)]
        out_rows += [r.out_row] * (m + 1)
        out_cols += cols
        out_tokens += outputs
        counts.append(e)
        emitted.append(tuple(outputs[:e]))
    plan = VerifyPlan(
        np.concatenate(kv_cells),
        np.concatenate(kv_ids),
        np.array(out_rows, dtype=np.int64),
        np.array(out_cols, dtype=np.int64),
        np.array(out_tokens, dtype=DTYPE),
        np.array(counts, dtype=np.int64),
        tuple(emitted),
        tuple(r.start + r.shift + 1 for r in seqs),
        tuple(r.drafts for r in seqs),
    )
    if shadow is not None:
        starts = np.array([r.start for r in seqs], dtype=np.int64)
        ends = np.array([r.end for r in seqs], dtype=np.int64)
        slots = np.array([r.slot for r in seqs], dtype=np.int64)
        shadow.read(op, slots, tables, starts, ends, cached, fresh, plan.kv_cells, plan.kv_ids)
        rec = shadow.reads[op]
        rec.judged = starts + np.array([r.shift + 1 for r in seqs], dtype=np.int64)
    return plan, unresolved


def write(buf: Buffers, plan: VerifyPlan, parity: int, op: int, shadow: KvShadow | None) -> None:
    """The kernel's writes at its end (a later sequence wins a cell two of them write)."""
    buf.kv[plan.kv_cells] = plan.kv_ids
    buf.token_pool[plan.out_rows, plan.out_cols] = plan.out_tokens
    buf.spec_out[parity, : len(plan.counts)] = plan.counts
    if shadow is not None:
        shadow.write(op, [t[0] for t in plan.emitted], plan.emitted)


def copy_out(config: SchedulerConfig, buf: Buffers, parity: int, n: int) -> np.ndarray:
    """What the D2H after the forward reads: each sequence's drafts + 1 output cells (at its
    resolved shift, as the metadata holds it now), then each sequence's emitted count."""
    tokens: list[int] = []
    for r in rows(config, buf.metadata, parity, n):
        for t in range(r.drafts + 1):
            tokens.append(
                int(buf.token_pool[r.out_row, (r.out_col + r.shift + t) % config.max_seq_len])
            )
    counts = buf.spec_out[parity, :n].tolist()
    return np.array(tokens + counts, dtype=np.int64)


def resolve(buf: Buffers, parity: int, sources: list[tuple[int, int]], fields: int) -> None:
    """`Device.resolve`'s kernel: each placeholder's shift from the previous batch's counts."""
    previous = 1 - parity
    for i, source in sources:
        buf.metadata[parity, i * fields + SHIFT_FIELD] = buf.spec_out[previous, source] - 1
