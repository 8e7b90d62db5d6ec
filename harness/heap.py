"""Keep the C heap a run frees for the next run, instead of handing it back to the system.

A run with every check holds a few megabytes more than one without (vector clocks, shadow cells,
each request's context keys), much of it in the C heap (numpy's arrays, long lists). When the run
ends and frees it, glibc gives the top of the heap back to the system (its trim threshold is
128 KiB), and the next run faults the same pages in again: about 600 page faults, 3 ms of system
time per decode run on the 2-core machine, a twentieth of what the checks cost. A process of
ours that does many runs keeps them instead (the command line's, each search worker, the
benchmarks; a library call such as `run_scenario` leaves the allocator as it found it): freed
memory stays with the process up to `_TRIM_BELOW`, and arrays up to `_MMAP_FROM` come from the
heap, not from a fresh mapping each time (glibc's own bound for its adaptive threshold; setting
the trim threshold ends that adaptation, so both are set). Another C library refuses these
settings: nothing changes.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_TRIM_BELOW = 64 << 20
_MMAP_FROM = 32 << 20


@cache
def keep_freed_heap() -> bool:
    """Once per process: glibc keeps freed heap for reuse. True if it took the settings."""
    return sys.platform.startswith("linux") and _set()


def _set() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_BELOW) and mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM))
