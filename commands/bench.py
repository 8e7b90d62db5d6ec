"""`overlapcheck bench`: measurements that print numbers (never timed tests)."""

from __future__ import annotations

import argparse

from overlapcheck.commands.common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure the simulator's speed (and more, by flag)")
    p.add_argument("--faults", action="store_true", help="time to first failure per named fault")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="--faults: each search as N streams in processes (like explore --workers)",
    )
    p.add_argument(
        "--policies",
        action="store_true",
        help="queue policies on shared-prefix workloads: cache hits, latency, fairness",
    )
    p.add_argument(
        "--mutants",
        nargs="*",
        metavar="ID",
        help="mutation score: search each one-spot mutant of the reference scheduler "
        "(bench/mutants.py; all of them, or the ids given)",
    )
    p.add_argument(
        "--mutant-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="--mutants: search seconds per mutant (default 60)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    from overlapcheck.bench import sim_speed

    sim_speed.main()
    if args.faults:
        from overlapcheck.bench import fault_search

        fault_search.main(args.workers)
    if args.policies:
        from overlapcheck.bench import policies

        policies.main()
    if args.mutants is not None:
        from overlapcheck.bench import mutation_score

        mutation_score.main(args.mutants, args.mutant_budget)
    return 0
