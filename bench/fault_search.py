"""Time to first failure and shrunk size for each named fault (median of 5 seeds)."""

from __future__ import annotations

import statistics

from overlapcheck.explore.search import search
from overlapcheck.reference.faults import FAULTS

SEEDS = range(5)


def main() -> None:
    print("fault search: explore from an empty database, all invariants on, median of 5 seeds")
    print(
        f"{'fault':<24}{'found':>6}{'first fail s':>13}{'examples':>9}{'total s':>9}"
        f"{'requests':>9}{'iterations':>11}  invariants"
    )
    for name in FAULTS:
        firsts, examples, totals, reqs, iters, invs = [], [], [], [], [], set()
        for seed in SEEDS:
            result = search(faults=frozenset([name]), budget=120, max_examples=20_000, seed=seed)
            if result.found is None:
                continue
            firsts.append(result.stats.first_failure or 0.0)
            examples.append(result.stats.examples_to_failure or 0)
            totals.append(result.stats.seconds)
            run = result.found.result
            reqs.append(len(run.scenario.requests))
            iters.append(run.iterations)
            invs.add(run.violations[0].invariant)
        if not firsts:
            print(f"{name:<24}{'0/5':>6}")
            continue
        print(
            f"{name:<24}{len(firsts):>4}/5{statistics.median(firsts):>13.2f}"
            f"{statistics.median(examples):>9.0f}{statistics.median(totals):>9.2f}"
            f"{statistics.median(reqs):>9.0f}{statistics.median(iters):>11.0f}"
            f"  {', '.join(sorted(invs))}"
        )


if __name__ == "__main__":
    main()
