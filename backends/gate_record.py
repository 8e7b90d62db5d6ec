"""Where a GPU replay's gates write what they saw: a file both a repeat's process and its parent
map, so that the record outlives a run the device stopped and the process that ran it.

A device-side assert (the racy order put an index out of bounds) leaves the process's CUDA
context dead: device memory can no longer be read, and PyTorch may abort the process outright.
A spin that writes its record into host memory the device reaches directly (the file's pages,
registered with CUDA as mapped, pinned memory) leaves it where a plain read finds it afterwards,
by the process itself or by its parent once the process is gone.

Layout (int64): the repeat the record belongs to, then each gate's state, then the nanoseconds
each waited (one more slot of each than gates: the driver's warm-up gate).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from overlapcheck.backends.gates import CLOSED

_HEADER = 1
NOT_WRITTEN = -1  # the repeat slot of a record no repeat has claimed yet


def slots(count: int) -> int:
    """The record's length for `count` gates, in int64 slots."""
    return _HEADER + 2 * (count + 1)


def start(path: Path, count: int, repeat: int) -> None:
    """A fresh record for `count` gates of repeat `repeat`: every gate not reached yet."""
    values = np.zeros(slots(count), dtype=np.int64)
    values[0] = repeat
    path.write_bytes(values.tobytes())


def read(path: Path, count: int, repeat: int) -> list[tuple[int, float]] | None:
    """Each gate's (state, seconds waited) as repeat `repeat`'s spins left them, or None when
    the file holds no record of that repeat (missing, cut short, or another repeat's)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) != 8 * slots(count):
        return None
    values = np.frombuffer(raw, dtype=np.int64)
    if int(values[0]) != repeat:
        return None
    states = values[_HEADER : _HEADER + count]
    waited = values[_HEADER + count + 1 : _HEADER + 2 * count + 1]
    return [(int(s), int(w) / 1e9) for s, w in zip(states, waited, strict=True)]


def reached(record: list[tuple[int, float]]) -> bool:
    """Whether any gate's spin got as far as writing its state."""
    return any(state != CLOSED for state, _ in record)
