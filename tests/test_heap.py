"""The heap a run frees stays with a process of ours for its next run (`harness/heap.py`)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A decode run with every check, then the same again: the second's page faults.
_SECOND_RUN_FAULTS = """
import resource, sys
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import run_scenario
if sys.argv[1] == "keep":
    assert keep_freed_heap()
scenario = decode_workload()
run_scenario(scenario, SimBackend())
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run_scenario(scenario, SimBackend())
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_run_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _SECOND_RUN_FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator settings")
def test_a_second_run_reuses_the_heap_the_first_freed() -> None:
    kept, given_back = _second_run_faults("keep"), _second_run_faults("default")
    # (about 80 against 600 on the 2-core machine: the rest are the interpreter's own arenas)
    assert kept * 2 < given_back, (kept, given_back)
