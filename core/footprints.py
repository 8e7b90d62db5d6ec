"""The footprints every backend records for the same device calls.

Backends call these to append operations to the trace; keeping them in one place is what makes the
race checker and the timeline backend-agnostic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from overlapcheck.core.batch import METADATA_FIELDS, BatchInput, RowWrite
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.trace import (
    HOST,
    KV,
    METADATA,
    PAGE_TABLE,
    STAGING,
    TOKEN_POOL,
    Access,
    Op,
    Trace,
    host_output_buffer,
)


class FootprintRecorder:
    """Appends operations with their footprints to a trace, tagged with the current step/phase."""

    def __init__(self, config: SchedulerConfig, trace: Trace) -> None:
        self.width = config.max_seq_len
        self.metadata_width = METADATA_FIELDS * (config.num_slots + 1)
        self.trace = trace
        self.step = 0
        self.phase = "idle"

    def op(self, agent: str, kind: str, issue: float, **fields: object) -> Op:
        op = Op(
            seq=self.trace.next_seq(),
            agent=agent,
            kind=kind,
            step=self.step,
            phase=self.phase,
            issue=issue,
            **fields,  # type: ignore[arg-type]
        )
        return self.trace.add(op)

    # -- footprints ---------------------------------------------------------------------------

    def rows(self, buffer: str, writes: Sequence[RowWrite]) -> Access:
        parts = [
            np.arange(w.row * self.width + w.start, w.row * self.width + w.start + len(w.values))
            for w in writes
        ]
        return Access(buffer, _cells(parts), "w")

    def metadata_cells(self, batch: BatchInput) -> np.ndarray:
        n = METADATA_FIELDS * len(batch.seqs)
        base = (batch.batch_id % 2) * self.metadata_width
        return np.arange(base, base + n, dtype=np.int64)

    def staging_cells(self, batch: BatchInput) -> np.ndarray:
        return np.arange(METADATA_FIELDS * len(batch.seqs), dtype=np.int64)

    def forward_accesses(self, batch: BatchInput) -> list[Access]:
        w = self.width
        inputs, table, context, new_kv, outputs = [], [], [], [], []
        for s in batch.seqs:
            inputs.append(np.arange(s.slot * w + s.start, s.slot * w + s.end))
            table.append(np.arange(s.slot * w, s.slot * w + s.end))
            cells = np.asarray(s.kv_cells, dtype=np.int64)
            context.append(cells[: s.end])
            new_kv.append(cells[s.start : s.end])
            outputs.append(np.array([s.out_row * w + s.out_col]))
        return [
            Access(METADATA, self.metadata_cells(batch), "r"),
            Access(TOKEN_POOL, _cells(inputs), "r"),
            Access(PAGE_TABLE, _cells(table), "r"),
            Access(KV, _cells(context), "r"),
            Access(KV, _cells(new_kv), "w"),
            Access(TOKEN_POOL, _cells(outputs), "w"),
        ]

    def d2h_accesses(self, batch: BatchInput) -> list[Access]:
        w = self.width
        sampled = _cells([np.array([s.out_row * w + s.out_col]) for s in batch.seqs])
        out = np.arange(len(batch.seqs), dtype=np.int64)
        return [
            Access(TOKEN_POOL, sampled, "r"),
            Access(host_output_buffer(batch.batch_id), out, "w"),
        ]

    def staging_write(self, batch: BatchInput, issue: float) -> Op:
        return self.op(
            HOST,
            "stage",
            issue,
            label=f"stage {batch.label}",
            batch=batch.batch_id,
            uids=batch.uids,
            accesses=[Access(STAGING, self.staging_cells(batch), "w")],
            start=issue,
            end=issue,
        )

    def metadata_copy_accesses(self, batch: BatchInput) -> list[Access]:
        return [
            Access(STAGING, self.staging_cells(batch), "r"),
            Access(METADATA, self.metadata_cells(batch), "w"),
        ]

    def output_read(self, batch: BatchInput, issue: float) -> Op:
        out = np.arange(len(batch.seqs), dtype=np.int64)
        return self.op(
            HOST,
            "read_output",
            issue,
            label=f"read {batch.label}",
            batch=batch.batch_id,
            uids=batch.uids,
            accesses=[Access(host_output_buffer(batch.batch_id), out, "r")],
            start=issue,
            end=issue,
        )


def _cells(parts: Sequence[np.ndarray]) -> np.ndarray:
    # Duplicates are harmless to the race checker (shared prefixes are read by several sequences),
    # so no sort/unique here: this runs several times per simulated iteration.
    if not parts:
        return np.empty(0, dtype=np.int64)
    if len(parts) == 1:
        return parts[0].astype(np.int64, copy=False)
    return np.concatenate(parts).astype(np.int64, copy=False)
