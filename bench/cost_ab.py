"""The checks' CPU cost (`bench --speed`'s `cost` column) of this checkout against another
revision's, on the same machine, the two taking turns.

A virtual or shared machine moves a run's CPU time by half from one second to the next (measured
on the 2-core machine and the 16-core H200 guest alike), and one `bench --speed` moves its median
ratio by a tenth between invocations: one invocation of each revision says nothing about a change
of a few hundredths. Here each revision runs `--reps` separate processes of `--rounds` rounds,
alternating, and the median of their medians is compared.

    python -m overlapcheck.bench.cost_ab --rev main --reps 5 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from overlapcheck.bench.worktree import ROOT, add_rev_argument, revision_tree, run_from

_MEASURE = """
import json, sys
from overlapcheck.bench.sim_speed import measure
rows = measure(int(sys.argv[1]))
print(json.dumps({r.invariants: r.cost_ratio for r in rows}))
"""


def cost(tree: Path, rounds: int) -> dict[str, float]:
    """One process of `rounds` rounds from `tree`: each check set's cost ratio."""
    out = run_from(tree, _MEASURE, str(rounds), OPENBLAS_NUM_THREADS="1")
    ratios: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rev_argument(parser)
    parser.add_argument("--reps", type=int, default=5, help="processes per revision")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per process")
    args = parser.parse_args()
    if args.reps < 1 or args.rounds < 1:
        parser.error("--reps and --rounds must be at least 1")
    runs: dict[str, list[dict[str, float]]] = {"this checkout": [], args.rev: []}
    with revision_tree(args.rev) as other:
        for rep in range(args.reps):
            for name, tree in (("this checkout", ROOT), (args.rev, other)):
                ratios = cost(tree, args.rounds)
                runs[name].append(ratios)
                shown = "  ".join(f"{k} {v:.3f}" for k, v in ratios.items() if v != 1.0)
                print(f"{name:>14} process {rep + 1}: {shown}", flush=True)
    print("median of the processes' median cost ratios:")
    for name, found in runs.items():
        sets = found[0].keys()
        medians = "  ".join(f"{k} {statistics.median(r[k] for r in found):.3f}" for k in sets)
        print(f"{name:>14}: {medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
