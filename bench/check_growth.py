"""What the checks cost per iteration as a run gets longer: the decode batch of `sim_speed` at
several `max_tokens` (the pool and the rows grow with it), each check set's CPU time over the
footprints-only run's, divided by the iterations. A check that walks everything seen so far
instead of what changed shows as a cost that climbs with the length.

    python -m overlapcheck.bench.check_growth [--scheduler SPEC] [--lengths 24,96,192,384]

(`--scheduler overlapcheck.adapters.minisgl:make_scheduler` with MINISGL_PATH set, say.) Each
set's time is the fastest of `--rounds`, the sets run in turn round after round.
"""

from __future__ import annotations

import argparse
import sys
import time

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.errors import UserError
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec

# The checks with per-step state worth watching alone (each alone also pays the books' reading
# where it is the first to ask for them), then all of them.
SETS: tuple[tuple[str, list[str] | None], ...] = (
    ("footprints only", []),
    ("no-race", ["no-race"]),
    ("slot-not-in-flight", ["slot-not-in-flight"]),
    ("pages-conserved", ["pages-conserved"]),
    ("all invariants", None),
)


def measure(spec: SchedulerSpec, lengths: list[int], rounds: int) -> dict[int, list[float]]:
    """Per length: each set's check cost in microseconds per iteration (the first, footprints
    only, is its whole CPU time per iteration)."""
    keep_freed_heap()
    found: dict[int, list[float]] = {}
    for length in lengths:
        scenario = decode_workload(max_tokens=length)
        best = [float("inf")] * len(SETS)
        iterations = 1
        for _ in range(rounds):
            for i, (_, invariants) in enumerate(SETS):
                start = time.process_time()
                result = run_scenario(
                    scenario, SimBackend(), invariants, scheduler=spec, keep_going=True
                )
                best[i] = min(best[i], time.process_time() - start)
                iterations = result.iterations
        base = best[0]
        found[length] = [base / iterations * 1e6] + [
            (t - base) / iterations * 1e6 for t in best[1:]
        ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default="reference")
    parser.add_argument("--lengths", default="24,96,192,384")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        spec = SchedulerSpec.load(args.scheduler)
    except UserError as e:
        print(f"check_growth: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    lengths = [int(x) for x in args.lengths.split(",")]
    found = measure(spec, lengths, args.rounds)
    print(f"check cost, us per iteration ({args.scheduler}; footprints only: the whole run)")
    print(f"{'max_tokens':>20s}" + "".join(f"{n:>9d}" for n in lengths))
    for i, (label, _) in enumerate(SETS):
        print(f"{label:>20s}" + "".join(f"{found[n][i]:9.1f}" for n in lengths))


if __name__ == "__main__":
    main()
