"""KV provenance: a shadow per KV cell that says what a forward computed there.

A real KV entry is a function of its token, its position and every token before it. The shadow
keeps, per cell, the position it was computed for, a key (a 64-bit polynomial hash of the context
through that position: the token and its whole prefix) and the forward that wrote it. A device that
keeps one (the simulator does) records for each forward what every position of every sequence's
context held when the kernel read it, and what the kernel sampled; `kv-provenance` compares that
with each request's own context. Everything is numpy over whole batches: no loop over cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_BASE = 0x100000001B3  # odd, so invertible modulo 2**64
_MASK = (1 << 64) - 1


def _powers(base: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    value = 1
    for i in range(n):
        out[i] = value
        value = value * base & _MASK
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

    @staticmethod
    def extend(key: int, token: int) -> int:
        """The key through the next position, from the key through the previous one."""
        return (key * _BASE + token + 2) & _MASK


@dataclass(slots=True)
class ForwardReads:
    """What one forward's kernel read: row i is its i-th sequence, column p a context position.

    `keys[i, p]` is the key of the KV the kernel attended over at position p: for p < `starts[i]`
    what the cached cell held, for the new positions the key it computes from the cached prefix and
    the input id it read from `token_pool`. Columns past `ends[i]` mean nothing. The rest is kept
    to explain a mismatch.
    """

    op: int  # the forward's op seq
    starts: np.ndarray
    ends: np.ndarray
    cells: np.ndarray  # the KV cell of each position, from the device's page table
    keys: np.ndarray
    meta: np.ndarray  # what each cell held: writer op seq << _POS_BITS | position (-1: never)
    cached: np.ndarray  # the KV values read (the tokens, in the simulator)
    fresh: np.ndarray  # the token_pool rows read
    new: tuple[np.ndarray, np.ndarray]  # rows and columns of the new positions
    samples: tuple[int, ...] | None = None  # set when the kernel ends
    # A verify forward (core/speculative.py): per sequence, the end of its committed positions
    # (the rest of its new positions are drafts or padding: not judged as the request's), and
    # the tokens it emitted from that end on.
    judged: np.ndarray | None = None
    emitted: tuple[tuple[int, ...], ...] | None = None

    def token(self, i: int, p: int) -> int:
        return int(self.cached[i, p] if p < self.starts[i] else self.fresh[i, p])

    def held(self, i: int, p: int) -> tuple[int, int]:
        """Writer op seq and position of what the cell at (i, p) held (-1, -1: never written)."""
        if p >= self.starts[i]:
            return self.op, p
        meta = int(self.meta[i, p])
        return (-1, -1) if meta < 0 else (meta >> _POS_BITS, meta & ((1 << _POS_BITS) - 1))


class KvShadow:
    """Per KV cell: the key of the KV a forward last computed into it, and its writer and position.

    `read` at a kernel's start, `write` at its end (so a write by another kernel in between is seen
    or missed as the values are). `reads` holds each forward's record until a check pops it.
    """

    def __init__(self, num_cells: int, width: int) -> None:
        self.key = np.zeros(num_cells, dtype=np.uint64)
        self.meta = np.full(num_cells, -1, dtype=np.int64)
        self.hash = PrefixHash(width)
        self.reads: dict[int, ForwardReads] = {}

    def read(
        self,
        op: int,
        cells: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        cached: np.ndarray,
        fresh: np.ndarray,
    ) -> None:
        """`cells`, `cached` (the KV values) and `fresh` (the `token_pool` rows): (n, width)."""
        # (ufuncs, not the .max() and .all() methods: their Python wrappers cost more here)
        n = len(ends)
        m = int(np.maximum.reduce(ends)) if n else 0
        cells = cells[:, :m]
        keys = self.key[cells]
        counts = np.maximum(ends - starts, 0)
        one_each = bool(n and not np.count_nonzero(counts != 1))  # a decode batch
        if one_each:
            rows, cols = np.arange(n), starts
        else:
            rows = np.repeat(np.arange(n), counts)
            first = np.cumsum(counts) - counts
            cols = np.arange(len(rows)) - np.repeat(first - starts, counts)
        if len(rows):
            keys[rows, cols] = self._extend(keys, rows, cols, starts, counts, fresh, one_each)
        self.reads[op] = ForwardReads(
            op, starts, ends, cells, keys, self.meta[cells], cached, fresh, (rows, cols)
        )

    def _extend(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        starts: np.ndarray,
        counts: np.ndarray,
        fresh: np.ndarray,
        one_each: bool,
    ) -> np.ndarray:
        """The new positions' keys: each sequence's cached prefix key, extended by the ids read."""
        n = len(starts)
        last = np.minimum(np.maximum(starts - 1, 0), keys.shape[1] - 1)
        base = np.where(starts > 0, keys[np.arange(n), last], 0)
        base = base.astype(np.uint64) * np.uint64(_BASE)
        terms = (fresh[rows, cols].astype(np.int64) + 2).astype(np.uint64)
        if one_each:
            out: np.ndarray = base + terms
            return out
        j = cols - starts[rows]  # offset inside the sequence's new positions
        scaled = terms * self.hash.inv[j]
        running = np.cumsum(scaled, dtype=np.uint64)
        first = np.cumsum(counts) - counts
        before = (running[first[counts > 0]] - scaled[first[counts > 0]]).astype(np.uint64)
        offset = np.zeros(n, dtype=np.uint64)
        offset[counts > 0] = before
        out = self.hash.pow[j] * (base[rows] + running - offset[rows])
        return out

    def save(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What `cells` hold, for a KV copy to the host (keys, writers and positions)."""
        return self.key[cells].copy(), self.meta[cells].copy()

    def restore(self, cells: np.ndarray, saved: tuple[np.ndarray, np.ndarray]) -> None:
        """A KV copy back: `cells` hold what the saved cells held (the same KV, moved)."""
        self.key[cells], self.meta[cells] = saved

    def write(
        self,
        op: int,
        samples: Sequence[int],
        emitted: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        rec = self.reads[op]
        rows, cols = rec.new
        written = rec.cells[rows, cols]
        self.key[written] = rec.keys[rows, cols]
        self.meta[written] = (op << _POS_BITS) | cols
        rec.samples = tuple(samples)
        rec.emitted = emitted
