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


class PrefixHash:
    """key[p] = sum over i <= p of (token_i + 1) * B**(p - i), modulo 2**64: the hash of the context
    through position p, computed for all p at once and extended one token at a time."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.pow = _powers(_BASE, width + 1)
        self.inv = _powers(pow(_BASE, -1, 1 << 64), width + 1)

    def keys(self, tokens: np.ndarray) -> np.ndarray:
        """Keys of every prefix along the last axis (uint64 arithmetic wraps, as intended)."""
        m = tokens.shape[-1]
        terms = (tokens.astype(np.int64) + 1).astype(np.uint64) * self.inv[:m]
        out: np.ndarray = np.cumsum(terms, axis=-1, dtype=np.uint64) * self.pow[:m]
        return out

    @staticmethod
    def extend(key: int, token: int) -> int:
        """The key through the next position, from the key through the previous one."""
        return (key * _BASE + token + 1) & _MASK


@dataclass(slots=True)
class ForwardReads:
    """What one forward's kernel read: row i is its i-th sequence, column p a context position.

    Columns before `starts[i]` come from the KV cache (what the cell held: its position, key and
    writer); columns from `starts[i]` to `ends[i]` are the new positions, read from `token_pool`
    (their key is computed from what was read). Columns past `ends[i]` mean nothing.
    """

    op: int  # the forward's op seq
    starts: np.ndarray
    ends: np.ndarray
    cells: np.ndarray  # the KV cell of each position, from the device's page table
    tokens: np.ndarray  # the token at each position as the kernel saw it
    pos: np.ndarray  # the position each cell's KV was computed for (-1: never written)
    keys: np.ndarray  # the key it was computed under
    writer: np.ndarray  # the op seq of the forward that computed it (-1: none)
    computed: np.ndarray  # the keys this forward computes from what it read
    samples: tuple[int, ...] | None = None  # set when the kernel ends


class KvShadow:
    """Per KV cell: the position, key and writer of the KV a forward last computed into it.

    `read` at a kernel's start, `write` at its end (so a write by another kernel in between is seen
    or missed as the values are). `reads` holds each forward's record until a check pops it.
    """

    def __init__(self, num_cells: int, width: int) -> None:
        self.pos = np.full(num_cells, -1, dtype=np.int64)
        self.key = np.zeros(num_cells, dtype=np.uint64)
        self.writer = np.full(num_cells, -1, dtype=np.int64)
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
        m = int(ends.max()) if len(ends) else 0
        cells = cells[:, :m]
        col = np.arange(m)
        old = col < starts[:, None]
        tokens = np.where(old, cached[:, :m], fresh[:, :m])
        computed = self.hash.keys(tokens)
        self.reads[op] = ForwardReads(
            op,
            starts,
            ends,
            cells,
            tokens,
            np.where(old, self.pos[cells], col),
            np.where(old, self.key[cells], computed),
            np.where(old, self.writer[cells], op),
            computed,
        )

    def write(self, op: int, samples: Sequence[int]) -> None:
        rec = self.reads[op]
        col = np.arange(rec.cells.shape[1])
        new = (col >= rec.starts[:, None]) & (col < rec.ends[:, None])
        written = rec.cells[new]
        self.pos[written] = np.broadcast_to(col, new.shape)[new]
        self.key[written] = rec.computed[new]
        self.writer[written] = op
        rec.samples = tuple(samples)
