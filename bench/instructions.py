"""The checks' cost in instructions: what `bench --speed`'s `cost` column measures in CPU time,
counted by valgrind's cachegrind instead, so that a change of a hundredth shows in one run on any
machine (CPU times move by a third between runs on a shared or virtual one).

Each revision runs the `bench --speed` workload (decode batch of 8, 257 iterations) in three
processes after the same warm-up (one run of each check set): `--runs` runs with every invariant,
`--runs` with footprints only, and one with footprints only. The checks' instructions a run are
the first two's difference over `--runs`, footprints only's the last two's over `--runs - 1`.
Instructions overweight numpy's bulk loops and miss what memory and branches cost, so the CPU
ratio stays the judge (`cost_ab`); this one says where a change moved the work.

    python -m overlapcheck.bench.instructions                 # this checkout
    python -m overlapcheck.bench.instructions --rev HEAD~1    # and another revision
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from overlapcheck.bench.worktree import ROOT, add_rev_argument, revision_tree, run_from

_RUN = """
import sys
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import run_scenario
keep_freed_heap()
scenario = decode_workload()
run_scenario(scenario, SimBackend(), None)
run_scenario(scenario, SimBackend(), [])
checks = None if sys.argv[1] == "all" else []
for _ in range(int(sys.argv[2])):
    run_scenario(scenario, SimBackend(), checks)
"""

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


class Cost(NamedTuple):
    footprints: float  # instructions a run, footprints only
    checks: float  # instructions a run, every invariant less footprints only

    @property
    def ratio(self) -> float:
        return 1 + self.checks / self.footprints


def instructions(log: str) -> int:
    """The instructions cachegrind counted, from its summary."""
    found = _REFS.search(log)
    if found is None:
        raise SystemExit("error: no instruction count in valgrind's output")
    return int(found.group(1).replace(",", ""))


def counted(tree: Path, checks: str, runs: int) -> int:
    """Instructions of one process from `tree` that warms up, then does `runs` runs."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cachegrind.log"
        wrapper = (
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            f"--log-file={log}",
        )
        # Idle BLAS threads and a random hash seed each move a count by tens of millions.
        env = {"OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        run_from(tree, _RUN, checks, str(runs), wrapper=wrapper, **env)
        return instructions(log.read_text())


def measure(tree: Path, runs: int) -> Cost:
    jobs = (("all", runs), ("none", runs), ("none", 1))
    with ThreadPoolExecutor(len(jobs)) as pool:
        every, none, once = pool.map(lambda job: counted(tree, *job), jobs)
    return Cost((none - once) / (runs - 1), (every - none) / runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rev_argument(parser)
    parser.set_defaults(rev=None)  # (only this checkout unless a revision is named)
    parser.add_argument("--runs", type=int, default=3, help="runs a process (at least 2)")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2")
    if shutil.which("valgrind") is None:
        raise SystemExit("error: valgrind is not installed (it counts the instructions)")
    print(f"instructions a run, {args.runs} runs a process (valgrind cachegrind):", flush=True)
    show("this checkout", measure(ROOT, args.runs))
    if args.rev is not None:
        with revision_tree(args.rev) as other:
            show(args.rev, measure(other, args.runs))
    return 0


def show(name: str, cost: Cost) -> None:
    print(
        f"{name:>14}: footprints only {cost.footprints / 1e6:.1f} M, the checks "
        f"{cost.checks / 1e6:.1f} M (ratio {cost.ratio:.3f})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
