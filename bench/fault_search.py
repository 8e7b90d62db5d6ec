"""Time to first failure and shrunk size for each named fault (median of 5 seeds).

`--workers N` runs each search as N streams in processes (`explore --workers N`): the time to the
first failure is then the time until any stream finds one.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from overlapcheck.explore.parallel import search_streams
from overlapcheck.explore.search import SearchSpec
from overlapcheck.reference.faults import FAULTS

SEEDS = range(5)


def main(workers: int = 1, seeds: range = SEEDS) -> list[dict[str, Any]]:
    """Print the table; return its rows (medians; None where no seed found the fault)."""
    n = len(seeds)
    rows: list[dict[str, Any]] = []
    print(
        f"fault search: explore from an empty database, all invariants on, median of {n} seeds, "
        f"{workers} worker(s)"
    )
    print(
        f"{'fault':<24}{'found':>6}{'first fail s':>13}{'examples':>9}{'total s':>9}"
        f"{'shrink s':>9}{'requests':>9}{'iterations':>11}  invariants"
    )
    all_shrinks: list[float] = []
    for name in FAULTS:
        firsts, examples, totals, shrinks, reqs, iters, invs = [], [], [], [], [], [], set()
        for seed in seeds:
            spec = SearchSpec(faults=frozenset([name]), budget=120, max_examples=20_000, seed=seed)
            outcome = search_streams(spec, workers)
            if outcome.interrupted:
                raise KeyboardInterrupt  # Ctrl-C ends the benchmark, not one search
            if outcome.found is None:
                continue
            firsts.append(outcome.stats.first_failure or 0.0)
            examples.append(outcome.stats.examples_to_failure or 0)
            totals.append(outcome.stats.seconds)
            shrinks.append(outcome.stats.seconds - (outcome.stats.first_failure or 0.0))
            reqs.append(outcome.found.requests)
            iters.append(outcome.found.iterations)
            invs.add(outcome.found.invariant)
        row: dict[str, Any] = {"fault": name, "found": len(firsts), "seeds": n}
        rows.append(row)
        if not firsts:
            print(f"{name:<24}{f'0/{n}':>6}")
            continue
        row.update(
            first_failure_s=statistics.median(firsts),
            examples=statistics.median(examples),
            total_s=statistics.median(totals),
            shrink_s=statistics.median(shrinks),
            requests=statistics.median(reqs),
            iterations=statistics.median(iters),
            invariants=sorted(invs),
        )
        print(
            f"{name:<24}{len(firsts):>4}/{n}{statistics.median(firsts):>13.2f}"
            f"{statistics.median(examples):>9.0f}{statistics.median(totals):>9.2f}"
            f"{statistics.median(shrinks):>9.2f}"
            f"{statistics.median(reqs):>9.0f}{statistics.median(iters):>11.0f}"
            f"  {', '.join(sorted(invs))}"
        )
        all_shrinks += shrinks
    if all_shrinks:
        print(
            "median shrink time over every found fault and seed: "
            f"{statistics.median(all_shrinks):.2f} s"
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    main(parser.parse_args().workers)
