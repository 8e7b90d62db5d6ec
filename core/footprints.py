"""The footprints every backend records for the same device calls.

Backends call these to append operations to the trace; keeping them in one place is what makes the
race checker and the timeline backend-agnostic.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from overlapcheck.core import speculative as spec
from overlapcheck.core.batch import BatchInput, RowWrite, SeqWork
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.contract import ContractError, check_batch, check_kv_cells, check_kv_copy
from overlapcheck.core.device import KvCopy
from overlapcheck.core.sites import Site, caller
from overlapcheck.core.trace import (
    HOST,
    KV,
    KV_OFFLOAD,
    METADATA,
    PAGE_TABLE,
    STAGING,
    TOKEN_POOL,
    Access,
    Launch,
    Op,
    Release,
    Trace,
    host_output_buffer,
)

_count = np.count_nonzero


class FootprintRecorder:
    """Appends operations with their footprints to a trace, tagged with the current step/phase."""

    def __init__(self, config: SchedulerConfig, trace: Trace) -> None:
        self.config = config
        self.width = config.max_seq_len
        self.fields = spec.metadata_fields(config)
        self.metadata_width = self.fields * (config.num_slots + 1)
        self.trace = trace
        self.step = 0
        self.phase = "idle"
        # Each slot's KV cells as last recorded: a Python list, and the same as int64 in the
        # slot's row here. A decode step's context is the last one plus a cell, so only the new
        # cells need converting from Python ints (the prefix is compared, list to list, in C).
        self.num_slots = config.num_slots
        self._slot_cells = np.zeros((config.num_slots, self.width), dtype=np.int64)
        self._slot_lists: dict[int, list[int]] = {}
        self._samples: tuple[BatchInput, np.ndarray] | None = None  # the last batch's sample cells
        # The batch whose metadata each parity's slot was last staged for (`stage_metadata`): a
        # forward reads its own, so one without it staged broke the contract.
        self._staged = [-1, -1]
        # What the contract checks keep every recorded cell below (`Trace.sizes`).
        trace.sizes.update(
            {
                TOKEN_POOL: (config.dummy_row + 1) * self.width,
                PAGE_TABLE: config.num_slots * self.width,
                KV: config.num_cells,
                METADATA: 2 * self.metadata_width,
                STAGING: self.metadata_width,
            }
        )
        if config.draft_tokens:
            trace.sizes[spec.DRAFT_POOL] = config.num_slots * config.draft_tokens
            trace.sizes[spec.SPEC_OUT] = 2 * (config.num_slots + 1)

    def op(self, agent: str, kind: str, issue: float, **fields: object) -> Op:
        # Appended here rather than through Trace.add/next_seq: a dozen ops per iteration.
        ops = self.trace.ops
        op = Op(len(ops), agent, kind, self.step, self.phase, issue, **fields)  # type: ignore[arg-type]
        op.site = caller()
        ops.append(op)
        return op

    def op_at(self, agent: str, kind: str, issue: float, site: Site | None, **fields: object) -> Op:
        """`op` with its site already found (a backend that walked the frames anyway)."""
        ops = self.trace.ops
        op = Op(len(ops), agent, kind, self.step, self.phase, issue, site=site, **fields)  # type: ignore[arg-type]
        ops.append(op)
        return op

    def host_op(self, now: float, site: Site | None, label: str, accesses: list[Access]) -> Op:
        """`op_at` for a host op that ran now (a backend traces ~100 of them an iteration)."""
        ops = self.trace.ops
        op = Op(
            len(ops),
            HOST,
            "host",
            self.step,
            self.phase,
            now,
            label=label,
            accesses=accesses,
            start=now,
            end=now,
            site=site,
        )
        ops.append(op)
        return op

    def release(self, resource: str, ids: Sequence[int]) -> None:
        """`Device.released`: noted with the scheduler's frame, no operation traced."""
        trace = self.trace
        trace.releases.append(Release(resource, tuple(ids), len(trace.ops), self.step, caller()))

    # -- host operations (the same on every device) ---------------------------------------------

    def span(self, phase: str, now: float, work: int) -> Op:
        """A host phase beginning now; the device sets its end."""
        return self.op(HOST, "span", now, label=phase, start=now, work=work)

    def host_wait(self, event_id: int, now: float) -> Op:
        """The host blocking on an event from now; the device sets its end."""
        return self.op(HOST, "host_wait", now, label=f"wait e{event_id}", waits=event_id, start=now)

    def host_query(self, event_id: int, now: float) -> Op:
        """The host saw the event fired without blocking: ordered after it, as by a wait."""
        return self.op(
            HOST, "host_query", now, label=f"query e{event_id}", waits=event_id, start=now, end=now
        )

    def idle(self, start: float, end: float) -> Op:
        return self.op(HOST, "idle", start, label="idle", start=start, end=end)

    # -- stream operations (each device times them its own way) -------------------------------

    def metadata_copy(self, batch: BatchInput, stream: str, issue: float) -> Op:
        """The H2D of a batch's metadata out of the staging buffer."""
        self._staged[batch.batch_id % 2] = batch.batch_id
        return self._batch_op(
            stream,
            "h2d",
            issue,
            batch,
            f"metadata {batch.label}",
            self._metadata_copy_accesses(batch),
        )

    def forward(self, batch: BatchInput, stream: str, issue: float) -> Op:
        """The forward's op, once the batch is checked against the device contract (raises
        `ContractError` before anything is recorded)."""
        check_batch(self.config, batch)
        if spec.is_verify(batch):
            spec.check_verify(self.config, batch)
            accesses = self._verify_accesses(batch)
            seqs = batch.seqs
            shape = (
                np.fromiter((s.slot for s in seqs), np.int64, len(seqs)),
                np.fromiter((s.end for s in seqs), np.int64, len(seqs)),
            )
        else:
            spec.check_plain(batch)
            accesses, shape = self._forward_accesses(batch)
        if self._staged[batch.batch_id % 2] != batch.batch_id:
            raise ContractError(
                f"forward {batch.label} without its metadata staged: the forward reads the "
                f"metadata slot of its batch's parity, which `stage_metadata` fills; call it "
                f"for this batch before its forward"
            )
        op = self._batch_op(stream, "forward", issue, batch, batch.label, accesses)
        op.shape = shape
        launches = self.trace.launches
        if launches is not None:  # ranks compare what they launch (core/ranks.py)
            positions = tuple((s.start, s.end) for s in batch.seqs)
            launches.append(Launch(op.seq, batch.phase, batch.uids, positions))
        return op

    def resolve(self, batch: BatchInput, stream: str, issue: float) -> Op:
        """`Device.resolve`: reads the previous batch's `spec_out` for each placeholder sequence,
        writes the shift field of this batch's metadata."""
        sources = [s.source for s in batch.seqs if s.source >= 0]
        previous = (batch.batch_id - 1) % 2
        accesses = [
            Access(spec.SPEC_OUT, spec.spec_out_cells(previous, sources, self.num_slots), "r"),
            Access(METADATA, spec.shift_cells(batch, self.metadata_width), "w"),
        ]
        return self._batch_op(stream, "resolve", issue, batch, f"resolve {batch.label}", accesses)

    def d2h(self, batch: BatchInput, stream: str, issue: float) -> Op:
        """The copy of a batch's samples to its host output buffer."""
        accesses = (
            self._verify_d2h_accesses(batch) if spec.is_verify(batch) else self._d2h_accesses(batch)
        )
        return self._batch_op(stream, "d2h", issue, batch, f"d2h {batch.label}", accesses)

    def _batch_op(
        self,
        stream: str,
        kind: str,
        issue: float,
        batch: BatchInput,
        label: str,
        accesses: list[Access],
    ) -> Op:
        return self.op(
            stream,
            kind,
            issue,
            label=label,
            batch=batch.batch_id,
            uids=batch.uids,
            accesses=accesses,
        )

    # -- footprints ---------------------------------------------------------------------------

    def rows(self, buffer: str, writes: Sequence[RowWrite]) -> Access:
        width = self.config.draft_tokens if buffer == spec.DRAFT_POOL else self.width
        parts = [
            np.arange(w.row * width + w.start, w.row * width + w.start + len(w.values))
            for w in writes
        ]
        return Access(buffer, _cells(parts), "w")

    def metadata_cells(self, batch: BatchInput) -> np.ndarray:
        n = self.fields * len(batch.seqs)
        base = (batch.batch_id % 2) * self.metadata_width
        return np.arange(base, base + n, dtype=np.int64)

    def staging_cells(self, batch: BatchInput) -> np.ndarray:
        return np.arange(self.fields * len(batch.seqs), dtype=np.int64)

    def _forward_accesses(
        self, batch: BatchInput
    ) -> tuple[list[Access], tuple[np.ndarray, np.ndarray]]:
        """The forward's accesses, and its sequences' slots and context ends."""
        # One numpy call per array for the whole batch, not per sequence: this runs every
        # simulated iteration (never loop over cells in Python: see docs/architecture.md).
        w = self.width
        seqs = batch.seqs
        slots = np.fromiter((s.slot for s in seqs), np.int64, len(seqs))
        rows = slots * w
        starts = np.fromiter((s.start for s in seqs), np.int64, len(seqs))
        ends = np.fromiter((s.end for s in seqs), np.int64, len(seqs))
        # Each sequence's new positions are the tail of its context; the token pool has the page
        # table's width, so the input ids' cells are the page table cells at those positions.
        counts = ends - starts
        if _count(counts != 1):
            new = ranges(np.cumsum(ends) - counts, counts)
        else:  # a decode batch: each sequence's one new position is the last of its context
            new = np.cumsum(ends) - 1
        table = ranges(rows, ends)
        context = self._context(seqs, table, int(ends.sum()))
        check_kv_cells(self.config, batch, context)  # on the array, not sequence by sequence
        accesses = [
            Access(METADATA, self.metadata_cells(batch), "r"),
            Access(TOKEN_POOL, table[new], "r"),
            Access(PAGE_TABLE, table, "r"),
            Access(KV, context, "r"),
            Access(KV, context[new], "w"),
            Access(TOKEN_POOL, self._sample_cells(batch), "w"),
        ]
        return accesses, (slots, ends)

    def _verify_accesses(self, batch: BatchInput) -> list[Access]:
        cells = spec.verify_cells(batch.seqs, self.width, self.config.draft_tokens)
        check_kv_cells(self.config, batch, cells["context"])
        parity = batch.batch_id % 2
        out = spec.spec_out_cells(parity, range(len(batch.seqs)), self.num_slots)
        return [
            Access(METADATA, self.metadata_cells(batch), "r"),
            Access(TOKEN_POOL, cells["tokens_r"], "r"),
            Access(spec.DRAFT_POOL, cells["drafts_r"], "r"),
            Access(PAGE_TABLE, cells["table_r"], "r"),
            Access(KV, cells["context"], "r"),
            Access(KV, cells["kv_w"], "w"),
            Access(TOKEN_POOL, cells["tokens_w"], "w"),
            Access(spec.SPEC_OUT, out, "w"),
        ]

    def _verify_d2h_accesses(self, batch: BatchInput) -> list[Access]:
        cells = spec.verify_cells(batch.seqs, self.width, self.config.draft_tokens)
        out = spec.spec_out_cells(batch.batch_id % 2, range(len(batch.seqs)), self.num_slots)
        buffer = host_output_buffer(batch.batch_id)
        size = spec.output_size(batch)
        self.trace.sizes[buffer] = size
        return [
            Access(TOKEN_POOL, cells["tokens_w"], "r"),
            Access(spec.SPEC_OUT, out, "r"),
            Access(buffer, np.arange(size, dtype=np.int64), "w"),
        ]

    def _context(self, seqs: Sequence[SeqWork], table: np.ndarray, total: int) -> np.ndarray:
        """The KV cells the sequences read, `kv_cells[:end]` each, concatenated (`table`: their
        page table cells, at the same flat positions as in the slots' rows here)."""
        if len({s.slot for s in seqs}) == len(seqs):
            for s in seqs:
                raw = s.kv_cells[: s.end]
                cells: list[int] = raw if isinstance(raw, list) else list(raw)  # a private copy
                if not (0 <= s.slot < self.num_slots and len(cells) == s.end <= self.width):
                    break
                known = self._slot_lists.get(s.slot)
                same = 0
                if known is not None and len(known) <= len(cells) and cells[: len(known)] == known:
                    same = len(known)
                if same < len(cells):
                    self._slot_cells[s.slot, same : len(cells)] = cells[same:]
                self._slot_lists[s.slot] = cells
            else:
                cached: np.ndarray = self._slot_cells.ravel()[table]  # a copy
                return cached
        # Repeated or odd slots, or cells that do not match the ends: convert them all.
        return np.fromiter(
            itertools.chain.from_iterable(s.kv_cells[: s.end] for s in seqs), np.int64, total
        )

    def _sample_cells(self, batch: BatchInput) -> np.ndarray:
        # The forward and then its D2H ask for the same batch's: computed once.
        if self._samples is not None and self._samples[0] is batch:
            return self._samples[1]
        w = self.width
        cells = np.fromiter(
            (s.out_row * w + s.out_col for s in batch.seqs), np.int64, len(batch.seqs)
        )
        self._samples = (batch, cells)
        return cells

    def _d2h_accesses(self, batch: BatchInput) -> list[Access]:
        sampled = self._sample_cells(batch)
        out = np.arange(len(batch.seqs), dtype=np.int64)
        buffer = host_output_buffer(batch.batch_id)
        self.trace.sizes[buffer] = len(batch.seqs)
        return [Access(TOKEN_POOL, sampled, "r"), Access(buffer, out, "w")]

    def kv_copy(
        self, kind: str, stream: str, issue: float, saved: KvCopy, cells: Sequence[int]
    ) -> Op:
        """A KV offload (`kv_offload`: KV cells read, the host buffer written) or load
        (`kv_load`: the host buffer read, KV cells written), after the contract check."""
        check_kv_copy(self.config, saved, cells)
        kv = np.fromiter(cells, np.int64, len(cells))
        host = np.arange(saved.length, dtype=np.int64)
        self.trace.sizes[saved.buffer] = max(saved.length, 1)
        if kind == KV_OFFLOAD:
            accesses = [Access(KV, kv, "r"), Access(saved.buffer, host, "w")]
            label = f"offload kv{saved.id}"
        else:
            accesses = [Access(saved.buffer, host, "r"), Access(KV, kv, "w")]
            label = f"load kv{saved.id}"
        return self.op(stream, kind, issue, label=label, uids=(saved.uid,), accesses=accesses)

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

    def _metadata_copy_accesses(self, batch: BatchInput) -> list[Access]:
        return [
            Access(STAGING, self.staging_cells(batch), "r"),
            Access(METADATA, self.metadata_cells(batch), "w"),
        ]

    def output_read(self, batch: BatchInput, issue: float) -> Op:
        size = spec.output_size(batch) if spec.is_verify(batch) else len(batch.seqs)
        out = np.arange(size, dtype=np.int64)
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


def ranges(begins: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of `arange(b, b + n)` for each (b, n), in a few vectorised steps."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    cells: np.ndarray = np.arange(total, dtype=np.int64) + np.repeat(begins - offsets, lengths)
    return cells


def _cells(parts: Sequence[np.ndarray]) -> np.ndarray:
    # Duplicates are harmless to the race checker (shared prefixes are read by several sequences),
    # so no sort/unique here: this runs several times per simulated iteration.
    if not parts:
        return np.empty(0, dtype=np.int64)
    if len(parts) == 1:
        return parts[0].astype(np.int64, copy=False)
    return np.concatenate(parts).astype(np.int64, copy=False)
