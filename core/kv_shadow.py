"""KV provenance: a shadow per KV cell that says what a forward computed there.

A real KV entry is a function of its token, its position and every token before it. The shadow
keeps, per cell, the position it was computed for, a key (a 64-bit polynomial hash of the context
through that position: the token and its whole prefix) and the forward that wrote it. A device that
keeps one (the simulator does) records for each forward what every position of every sequence's
context held when the kernel read it, and what the kernel sampled; `kv-provenance` compares that
with each request's own context. Everything is numpy over whole batches: no loop over cells.

A forward's record is exact but compact: the cells it read (its page-table rows), the ids it read
for its new positions and the keys it computed for them, and the shadow's epoch (the count of
mutations so far) when it read. What a cached cell held then is what it holds now unless a later
mutation changed it, so the shadow logs every mutation in order: the cells a forward or a KV copy
wrote, with what they held before, and the page-table rows a copy wrote. `as_read` rebuilds a
read from that, and a check can follow the log to learn which cells it verified may have changed.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import numpy as np

_BASE = 0x100000001B3  # odd, so invertible modulo 2**64
_MASK = (1 << 64) - 1


@cache
def _powers(base: int, n: int) -> np.ndarray:
    """base**i modulo 2**64 for i < n, read-only: made once per width for every run's shadow."""
    values, value = [], 1
    for _ in range(n):
        values.append(value)
        value = value * base & _MASK
    out = np.array(values, dtype=np.uint64)
    out.flags.writeable = False
    return out


_POS_BITS = 24  # a cell's `meta` packs (writer op seq << _POS_BITS) | position


class PrefixHash:
    """key[p] = sum over i <= p of (token_i + 2) * B**(p - i), modulo 2**64: the hash of the context
    through position p (every term is non-zero, so contexts of different lengths differ), computed
    for all p at once and extended one token at a time."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.pow = _powers(_BASE, width + 1)
        self.inv = _powers(pow(_BASE, -1, 1 << 64), width + 1)

    def keys(self, tokens: np.ndarray) -> np.ndarray:
        """Keys of every prefix along the last axis (uint64 arithmetic wraps, as intended)."""
        m = tokens.shape[-1]
        terms = (tokens.astype(np.int64) + 2).astype(np.uint64) * self.inv[:m]
        out: np.ndarray = np.cumsum(terms, axis=-1, dtype=np.uint64) * self.pow[:m]
        return out

    def keys_after(self, key: int, tokens: Sequence[int]) -> np.ndarray:
        """Keys of the positions after one whose key is `key`, for their `tokens`."""
        more = self.keys(np.asarray(tokens, dtype=np.int64))
        out: np.ndarray = more + np.uint64(key) * self.pow[1 : len(more) + 1]
        return out

    @staticmethod
    def extend(key: int, token: int) -> int:
        """The key through the next position, from the key through the previous one."""
        return (key * _BASE + token + 2) & _MASK


class KvWrite(NamedTuple):
    """Cells whose shadow changed: a forward's writes (`op`: its seq) or a KV copy back (-1),
    with what each held before (its key and its `meta`)."""

    cells: np.ndarray
    old_key: np.ndarray
    old_meta: np.ndarray
    op: int


class TableWrite(NamedTuple):
    """Page-table entries a copy wrote, (slot, start, values) each: the cells a kernel reads are
    the entries of its slot's row, so entries not written since still name the same cells."""

    rows: Sequence[tuple[int, int, np.ndarray]]


Mutation = KvWrite | TableWrite


@dataclass(slots=True)
class ForwardReads:
    """What one forward's kernel read: row i is its i-th sequence, column p a context position.

    At p < `starts[i]` the kernel attended over what cell `cells[i, p]` held at `epoch`
    (`KvShadow.as_read`); at its new positions (`new`, row by row) over the key it computed from
    that cached prefix and the input id it read from `token_pool` (`ids`, `new_keys`; it writes
    them to `written`). Columns past `ends[i]` mean nothing.
    """

    op: int  # the forward's op seq
    epoch: int  # the shadow's mutations before the kernel read
    slots: list[int]  # each sequence's page-table row
    starts: np.ndarray
    ends: np.ndarray
    first: list[int]  # `starts`, as a list
    last: list[int]  # `ends`, as a list
    cells: np.ndarray  # the KV cell of each position, from the device's page table
    cached: np.ndarray  # the KV values read (the tokens, in the simulator)
    fresh: np.ndarray  # the token_pool rows read
    new: tuple[np.ndarray, np.ndarray]  # rows and columns of the new positions
    one_each: bool  # one new position per sequence (a decode batch): `ids[i]` is row i's
    written: np.ndarray
    ids: np.ndarray
    new_keys: np.ndarray  # int64: the keys' bits
    samples: tuple[int, ...] | None = None  # set when the kernel ends
    # A verify forward (core/speculative.py): per sequence, the end of its committed positions
    # (the rest of its new positions are drafts or padding: not judged as the request's), and
    # the tokens it emitted from that end on.
    judged: np.ndarray | None = None
    emitted: tuple[tuple[int, ...], ...] | None = None

    def token(self, i: int, p: int) -> int:
        return int(self.cached[i, p] if p < self.starts[i] else self.fresh[i, p])


class KvShadow:
    """Per KV cell: the key of the KV a forward last computed into it, and its writer and position.

    `read` at a kernel's start, `write` at its end (so a write by another kernel in between is seen
    or missed as the values are). `reads` holds each forward's record until a check `release`s
    it; `log` the mutations from `trimmed + 1` to `epoch` (those a check has not followed yet or
    that a held record's `as_read` needs).
    """

    def __init__(self, num_cells: int, width: int) -> None:
        self.key = np.zeros(num_cells, dtype=np.uint64)
        self.meta = np.full(num_cells, -1, dtype=np.int64)
        self.hash = PrefixHash(width)
        self.reads: dict[int, ForwardReads] = {}
        self.epoch = 0
        self.log: list[Mutation] = []
        self.trimmed = 0
        self._key64 = self.key.view(np.int64)  # the same keys, for int64 arithmetic
        self._where = np.full(num_cells, -1, dtype=np.int64)  # scratch of `as_read`
        # Per batch size n, never written: arange(n), and n copies of _BASE and of 2
        self._ranges: dict[int, np.ndarray] = {}
        self._times: dict[int, np.ndarray] = {}
        self._twos: dict[int, np.ndarray] = {}

    def read(
        self,
        op: int,
        slots: np.ndarray,
        cells: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        cached: np.ndarray,
        fresh: np.ndarray,
        written: np.ndarray,
        ids: np.ndarray,
    ) -> None:
        """`cells`, `cached` (the KV values) and `fresh` (the `token_pool` rows): (n, width);
        `written` and `ids`: the cells of the new positions, row by row, and the ids read there."""
        first, last = starts.tolist(), ends.tolist()
        n = len(last)
        # One new position per sequence (a decode batch): as many ids as sequences and none
        # without a new position. (The cells then have max(ends) columns: none to cut.)
        one_each = n == len(ids) and n > 0 and not any(map(operator.ge, first, last))
        if one_each:
            rows, cols = self._decode_rows(n), starts
            new_keys = self._decode_keys(cells, starts, first, ids)
        else:
            m = max(last, default=0)
            if cells.shape[1] != m:
                cells = cells[:, :m]
            rows, cols, new_keys = self._new_keys(cells, starts, ends, ids, m)
        self.reads[op] = ForwardReads(
            op,
            self.epoch,
            slots.tolist(),
            starts,
            ends,
            first,
            last,
            cells,
            cached,
            fresh,
            (rows, cols),
            one_each,
            written,
            ids,
            new_keys,
        )

    def _decode_rows(self, n: int) -> np.ndarray:
        """arange(n), with the constants of `_decode_keys` for n sequences made alongside."""
        every = self._ranges.get(n)
        if every is None:
            every = self._ranges[n] = np.arange(n)
            self._times[n] = np.full(n, _BASE, dtype=np.int64)
            self._twos[n] = np.full(n, 2, dtype=np.int64)
        return every

    def _decode_keys(
        self, cells: np.ndarray, starts: np.ndarray, first: list[int], ids: np.ndarray
    ) -> np.ndarray:
        """The key of each sequence's one new position: the key its last cached cell holds now
        (0 for none), extended by its id. In int64 (the same bits as uint64, and int32 ids add
        to it without a cast); the constants are whole arrays, as a scalar operand costs numpy
        more than the arithmetic on a handful of keys."""
        n, m = cells.shape
        # cells[i, starts[i] - 1] as a flat index (a 2-d fancy index costs twice as much)
        before = np.arange(-1, n * m - 1, m)
        before += starts
        base: np.ndarray = self._key64[cells.ravel()[before]]
        if 0 in first:
            base[starts == 0] = 0
        base *= self._times[n]  # (int64 wraps as uint64 does)
        base += ids
        base += self._twos[n]
        return base

    def _new_keys(
        self, cells: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: np.ndarray, m: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, columns and keys (int64 bits) of the new positions, any number per sequence."""
        if not len(ids):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        every = self._decode_rows(len(starts))
        counts = np.maximum(ends - starts, 0)
        rows = np.repeat(every, counts)
        at = np.cumsum(counts) - counts
        cols = np.arange(len(rows)) - np.repeat(at - starts, counts)
        end = np.minimum(np.maximum(starts - 1, 0), m - 1)
        base = np.where(starts > 0, self.key[cells[every, end]], 0)
        return rows, cols, self._extend(base, ids, rows, cols, starts, counts).view(np.int64)

    def _extend(
        self,
        base: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        starts: np.ndarray,
        counts: np.ndarray,
    ) -> np.ndarray:
        """The new positions' keys: each sequence's cached prefix key, extended by the ids read."""
        n = len(starts)
        base = base.astype(np.uint64) * np.uint64(_BASE)
        terms = (ids.astype(np.int64) + 2).astype(np.uint64)
        j = cols - starts[rows]  # offset inside the sequence's new positions
        scaled = terms * self.hash.inv[j]
        running = np.cumsum(scaled, dtype=np.uint64)
        first = np.cumsum(counts) - counts
        before = (running[first[counts > 0]] - scaled[first[counts > 0]]).astype(np.uint64)
        offset = np.zeros(n, dtype=np.uint64)
        offset[counts > 0] = before
        out: np.ndarray = self.hash.pow[j] * (base[rows] + running - offset[rows])
        return out

    def as_read(self, rec: ForwardReads) -> tuple[np.ndarray, np.ndarray]:
        """`keys[i, p]`: the key of the KV the kernel attended over at position p (what the cell
        held, or for a new position the key it computed); `meta[i, p]`: what the cell held,
        writer op seq << _POS_BITS | position (-1: never written). While `rec` is held."""
        cells = rec.cells
        keys, meta = self.key[cells], self.meta[cells]
        where = self._where
        for mut in reversed(self.log[rec.epoch - self.trimmed :]):
            if isinstance(mut, KvWrite):  # latest first: the earliest one's old value stays
                where[mut.cells] = np.arange(len(mut.cells))
                at = where[cells]
                where[mut.cells] = -1
                hit = at >= 0
                if hit.any():
                    keys[hit] = mut.old_key[at[hit]]
                    meta[hit] = mut.old_meta[at[hit]]
        rows, cols = rec.new
        keys[rows, cols] = rec.new_keys
        return keys, meta

    def held(self, rec: ForwardReads, i: int, p: int) -> tuple[int, int]:
        """Writer op seq and position of what the cell at (i, p) held (-1, -1: never written)."""
        if p >= rec.starts[i]:
            return rec.op, p
        cell = int(rec.cells[i, p])
        meta = int(self.meta[cell])
        for mut in self.log[rec.epoch - self.trimmed :]:
            if isinstance(mut, KvWrite):
                at = np.flatnonzero(mut.cells == cell)
                if len(at):
                    meta = int(mut.old_meta[at[0]])
                    break
        return (-1, -1) if meta < 0 else (meta >> _POS_BITS, meta & ((1 << _POS_BITS) - 1))

    def release(self, op: int, followed: int) -> None:
        """A check is done with `op`'s record and has followed the log through epoch `followed`."""
        reads = self.reads
        reads.pop(op, None)
        keep = followed
        if reads:  # the oldest record held read first (`read` adds them as epochs grow)
            oldest = next(iter(reads.values())).epoch
            if oldest < keep:
                keep = oldest
        if keep > self.trimmed:
            # Trimmed at once: a mutation's arrays freed a step after they were made are reused
            # by the next step's (measured: a thirty-two-step batch of them cost the run 1 % of
            # its CPU time, in the simulation's own allocations as much as in these).
            del self.log[: keep - self.trimmed]
            self.trimmed = keep

    def _mutate(self, mut: Mutation) -> None:
        self.log.append(mut)
        self.epoch += 1

    def save(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What `cells` hold, for a KV copy to the host (keys, writers and positions)."""
        return self.key[cells].copy(), self.meta[cells].copy()

    def restore(self, cells: np.ndarray, saved: tuple[np.ndarray, np.ndarray]) -> None:
        """A KV copy back: `cells` hold what the saved cells held (the same KV, moved)."""
        self._mutate(KvWrite(cells, self.key[cells], self.meta[cells], -1))
        self.key[cells], self.meta[cells] = saved

    def table_write(self, rows: Sequence[tuple[int, int, np.ndarray]]) -> None:
        """A copy wrote page-table entries: `values` into row `slot` from `start` on."""
        self._mutate(TableWrite(rows))

    def write(
        self,
        op: int,
        samples: Sequence[int],
        emitted: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        rec = self.reads[op]
        written = rec.written
        self._mutate(KvWrite(written, self.key[written], self.meta[written], op))
        self._key64[written] = rec.new_keys
        self.meta[written] = rec.new[1] | (op << _POS_BITS)
        rec.samples = tuple(samples)
        rec.emitted = emitted
