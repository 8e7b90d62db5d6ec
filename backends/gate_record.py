"""Where a GPU replay's gates write what they saw: a file both a repeat's process and its parent
map, so that the record outlives a run the device stopped and the process that ran it.

A device-side assert (the racy order put an index out of bounds) leaves the process's CUDA
context dead: device memory can no longer be read, and PyTorch may abort the process outright.
A spin that writes its record into host memory the device reaches directly (the file's pages,
registered with CUDA as mapped, pinned memory) leaves it where a plain read finds it afterwards,
by the process itself or by its parent once the process is gone. Only shared memory (tmpfs,
`/dev/shm`) can be so registered: Linux refuses to pin a regular file's writable pages for long
(CUDA then says "invalid argument"), so a record elsewhere is never offered to CUDA.

Layout (int64): the repeat the record belongs to and its count of gates, then each gate's state,
then the nanoseconds each waited (one more slot of each than gates: the driver's warm-up gate).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from overlapcheck.backends.gates import CLOSED

_HEADER = 2
NOT_WRITTEN = -1  # the repeat slot of a record no repeat has claimed yet


_PAGE = 4096  # the file is whole pages: CUDA registers pages


def slots(count: int) -> int:
    """The record's length for `count` gates, in int64 slots (the file may be longer)."""
    return _HEADER + 2 * (count + 1)


def states(count: int) -> slice:
    """Where the gates' states lie (the warm-up gate's last), in int64 slots."""
    return slice(_HEADER, _HEADER + count + 1)


def waits(count: int) -> slice:
    """Where the nanoseconds each gate waited lie (the warm-up gate's last)."""
    return slice(_HEADER + count + 1, _HEADER + 2 * (count + 1))


def size(count: int) -> int:
    """The record file's bytes for `count` gates: whole pages."""
    return -(-8 * slots(count) // _PAGE) * _PAGE


def start(path: Path, count: int, repeat: int) -> None:
    """A fresh record for `count` gates of repeat `repeat`: every gate not reached yet."""
    values = np.zeros(size(count) // 8, dtype=np.int64)
    values[0], values[1] = repeat, count
    path.write_bytes(values.tobytes())


def withdraw(path: Path, count: int) -> None:
    """The running repeat's gates keep no record in `path` (CUDA would not map it): the file says
    so, and a stopped run's gates read as not known, never as an earlier repeat's or as not
    reached."""
    start(path, count, NOT_WRITTEN)


def shared_dir() -> str | None:
    """A folder in shared memory for record files (None: the system's temporary folder)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) and on_shared_memory(shm) else None


def on_shared_memory(path: str | Path, mounts_file: Path = Path("/proc/mounts")) -> bool:
    """Whether `path` lies on a tmpfs mount (its longest mount point in `mounts_file`)."""
    try:
        mounts = mounts_file.read_text().splitlines()
    except OSError:
        return False
    target = os.path.realpath(path)
    best, kind = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind == "tmpfs"


def read(path: Path, count: int, repeat: int) -> list[tuple[int, float]] | None:
    """Each gate's (state, seconds waited) as repeat `repeat`'s spins left them, or None when
    the file holds no record of that repeat (missing, cut short, or another repeat's)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) != size(count):
        return None
    values = np.frombuffer(raw, dtype=np.int64)
    if int(values[0]) != repeat or int(values[1]) != count:
        return None
    seen, waited = values[states(count)][:count], values[waits(count)][:count]
    return [(int(s), int(w) / 1e9) for s, w in zip(seen, waited, strict=True)]


def reached(record: list[tuple[int, float]]) -> bool:
    """Whether any gate's spin got as far as writing its state."""
    return any(state != CLOSED for state, _ in record)
