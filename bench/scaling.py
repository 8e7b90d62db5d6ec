"""How the search scales with worker processes (`explore --workers N`).

    python -m overlapcheck.bench.scaling --workers 1,2,4,8,16 [--seconds 20] [--seeds 3]
    python -m overlapcheck.bench.scaling --scheduler overlapcheck.adapters.minisgl:make_scheduler \
        --no-find        # another scheduler's search (real code under the simulated CUDA)

Three measurements per worker count:
- throughput: the shipped scheduler (nothing to find) searched for `--seconds`: examples/s and
  scheduler iterations/s over all streams, and the speed-up against one worker;
- the machine's ceiling: N processes that only simulate (the `overlapcheck bench` decode run, no
  search, no database, no driver) for `--seconds`: what the machine gives N copies of the same
  work (shared caches, memory bandwidth, all-core clocks). The search's speed-up over it says
  what the search itself loses;
- time to find: the named fault that one worker takes longest to find (`--fault` to pin one),
  and the slowest-to-find mutant of the mutation bench (`--mutant`, default `evict-locked-node`,
  the slowest in docs/faults.md's table), median over `--seeds` seeds, each search from an empty
  example database.

With `--scheduler`, the throughput and the ceiling are that scheduler's (its search, and N
processes running it on the bench's decode workload); the time to find needs faults or mutants of
the reference, so it goes with `--no-find`.

Target: at least 0.8 N speed-up on N cores. Run it on a quiet machine with at least as
many cores as the largest count; the numbers go into docs/scaling.md's table.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.mutants import BY_ID
from overlapcheck.bench.mutation_score import materialize
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.errors import UserError
from overlapcheck.explore.parallel import Listener, Live, available_cores, search_streams
from overlapcheck.explore.search import SearchSpec
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.registry import INVARIANTS, RUN_ENDING
from overlapcheck.reference.faults import FAULTS

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier


def throughput(
    workers: int,
    seconds: float,
    scheduler: SchedulerSpec | None = None,
    skip: frozenset[str] = frozenset(),
) -> tuple[float, float]:
    """(examples/s, iterations/s) of `workers` streams with nothing to find, measured between the
    first progress report after every stream has started and the last one (process start-up
    is not search time)."""
    samples: list[Live] = []

    def on_progress(live: Live) -> None:
        samples.append(live)

    spec = SearchSpec(
        budget=seconds,
        max_examples=10**9,
        seed=0,
        round_size=10,
        scheduler=scheduler or SchedulerSpec(),
        skip=skip,
    )
    outcome = search_streams(spec, workers, Listener(progress=on_progress))
    assert outcome.found is None, outcome.found and outcome.found.violation
    steady = [s for s in samples if s.examples > 0 and s.alive == workers]
    if len(steady) < 2 or steady[-1].seconds - steady[0].seconds < 1:
        wall = outcome.stats.seconds
        return outcome.stats.examples / wall, outcome.stats.iterations / wall
    first, last = steady[len(steady) // 10], steady[-1]
    wall = last.seconds - first.seconds
    return (last.examples - first.examples) / wall, (last.iterations - first.iterations) / wall


def _simulate(seconds: float, scheduler: str, start: Barrier, out: Queue[float]) -> None:
    keep_freed_heap()  # as a search's worker does
    scenario = decode_workload()
    spec = SchedulerSpec.load(scheduler)
    run_scenario(scenario, SimBackend(), None, scheduler=spec)  # warm: imports, first-run caches
    start.wait()
    began = time.perf_counter()
    iterations = 0
    while time.perf_counter() - began < seconds:
        iterations += run_scenario(scenario, SimBackend(), None, scheduler=spec).iterations
    out.put(iterations / (time.perf_counter() - began))


def ceiling(workers: int, seconds: float, scheduler: str = "reference") -> float:
    """Simulated iterations/s (every invariant on) of `workers` processes that only simulate,
    started together."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(target=_simulate, args=(seconds, scheduler, start, out)) for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    total: float = sum(out.get() for _ in procs)
    for proc in procs:
        proc.join()
    return total


def time_to_find(
    target: SearchSpec, workers: int, seeds: int, budget: float
) -> tuple[float | None, int]:
    """Median seconds to the first failure of `target` (its faults or its scheduler) over
    `seeds` seeds, and how many found it."""
    times = []
    for seed in range(seeds):
        spec = replace(target, budget=budget, max_examples=10**9, seed=seed)
        outcome = search_streams(spec, workers)
        if outcome.stats.first_failure is not None:
            times.append(outcome.stats.first_failure)
    return (statistics.median(times) if times else None), len(times)


def slowest_fault(seeds: int, budget: float) -> str:
    """The named fault one worker takes longest to find (median over seeds)."""
    worst, worst_time = next(iter(FAULTS)), -1.0
    for name in FAULTS:
        median, _ = time_to_find(SearchSpec(faults=frozenset([name])), 1, seeds, budget)
        t = budget if median is None else median
        print(f"  1 worker: {name:<24} {t:6.2f} s", flush=True)
        if t > worst_time:
            worst, worst_time = name, t
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description="search scaling with --workers")
    parser.add_argument("--workers", default="1,2,4,8,16", help="comma-separated counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="throughput run length")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per time-to-find median")
    parser.add_argument("--budget", type=float, default=120.0, help="time-to-find budget")
    parser.add_argument("--fault", help="time this fault (default: the slowest to find)")
    parser.add_argument(
        "--mutant",
        default="evict-locked-node",
        choices=sorted(BY_ID),
        help="time this mutant too (default: evict-locked-node)",
    )
    parser.add_argument("--no-mutant", action="store_true", help="do not time a mutant")
    parser.add_argument("--no-find", action="store_true", help="throughput and ceiling only")
    parser.add_argument(
        "--scheduler",
        default="reference",
        help="search this scheduler (a spec as explore's --scheduler; with --no-find)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="INVARIANT",
        help="the throughput's search does not check it (repeatable): a finding ends a search",
    )
    args = parser.parse_args()
    if args.scheduler != "reference" and not args.no_find:
        parser.error("--scheduler: the time to find is the reference's faults; add --no-find")
    try:
        scheduler = SchedulerSpec.load(args.scheduler)
    except UserError as err:
        parser.error(str(err))
    skip = frozenset(args.skip)
    unknown = sorted(skip - {*INVARIANTS, *RUN_ENDING})
    if unknown:
        parser.error(f"--skip: unknown invariant {', '.join(unknown)}")
    counts = [int(c) for c in args.workers.split(",")]
    print(f"{available_cores()} cores available; worker counts {counts}; {args.scheduler}")
    if max(counts) > available_cores():
        print("  (more workers than cores: the larger counts measure oversubscription)")
    fault = args.fault
    if fault is None and not args.no_find:
        print("finding the slowest-to-find named fault with 1 worker:")
        fault = slowest_fault(args.seeds, args.budget)
    if not args.no_find:
        print(
            f"time to find: fault {fault}"
            + ("" if args.no_mutant else f" and mutant {args.mutant}")
            + f", median of {args.seeds} seeds, empty database"
        )
    print(
        f"{'workers':>7}{'examples/s':>12}{'iter/s':>10}{'speed-up':>10}{'per core':>10}"
        f"{'ceiling':>9}{'vs ceil':>9}{'fault s':>9}{'found':>7}{'mutant s':>10}{'found':>7}"
    )
    base: float | None = None
    ceiling_base: float | None = None
    with tempfile.TemporaryDirectory(prefix="overlapcheck-scaling-") as tmp:
        mutant = SearchSpec(scheduler=materialize(BY_ID[args.mutant], Path(tmp)))
        for n in counts:
            eps, ips = throughput(n, args.seconds, scheduler, skip)
            base = base or eps
            speed = eps / base
            machine = ceiling(n, args.seconds, args.scheduler)
            ceiling_base = ceiling_base or machine
            machine_speed = machine / ceiling_base
            row = (
                f"{n:>7}{eps:>12.1f}{ips:>10.0f}{speed:>9.2f}x{speed / n:>10.2f}"
                f"{machine_speed:>8.2f}x{speed / machine_speed:>9.2f}"
            )
            targets: list[tuple[SearchSpec, int]] = []
            if not args.no_find:
                targets.append((SearchSpec(faults=frozenset([fault or ""])), 9))
                if not args.no_mutant:
                    targets.append((mutant, 10))
            for target, width in targets:
                found_s, hits = time_to_find(target, n, args.seeds, args.budget)
                find = "-" if found_s is None else f"{found_s:.2f}"
                row += f"{find:>{width}}{hits:>5}/{args.seeds}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
