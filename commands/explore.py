"""`overlapcheck explore`: search workloads and timings for a violation, shrink, save, replay."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.commands.common import (
    add_check_option,
    load_profile,
    nonneg_int,
    positive_int,
)
from overlapcheck.core.config import POLICIES
from overlapcheck.errors import UserError
from overlapcheck.explore.search import SearchStats, search
from overlapcheck.formats import counterexample
from overlapcheck.invariants.registry import INVARIANTS
from overlapcheck.reference.faults import UnknownFaultError, parse_faults
from overlapcheck.scenarios.named import NAMED


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="search workloads and timings for a violation")
    p.add_argument("--scenario", default="all", help=f"all (default) or one of {', '.join(NAMED)}")
    p.add_argument(
        "--fault", action="append", default=[], metavar="NAME", help="re-enable a known bug"
    )
    p.add_argument(
        "--budget", type=float, default=60.0, metavar="SECONDS", help="time budget (default 60)"
    )
    p.add_argument("--max-examples", type=positive_int, default=100_000, help="example budget")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--out", default="counterexamples", help="where counterexamples go")
    p.add_argument("--db", help="a Hypothesis example database directory (shared with HypoFuzz)")
    p.add_argument("--timing", metavar="FILE", help="nominal timing profile (JSON)")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="INVARIANT",
        help="do not check this invariant (e.g. --skip no-race: look for races that corrupt "
        "tokens, the ones a GPU replay can show)",
    )
    p.add_argument("--policy", choices=POLICIES, help="pin the queue policy (default: drawn)")
    add_check_option(p)
    p.add_argument(
        "--no-timeline", action="store_true", help="do not draw timelines next to counterexamples"
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.scenario != "all" and args.scenario not in NAMED:
        raise UserError(
            f"unknown scenario {args.scenario!r} for explore: all or one of {', '.join(NAMED)}"
        )
    unknown = sorted(set(args.skip) - set(INVARIANTS))
    if unknown:
        raise UserError(f"unknown invariant {', '.join(unknown)} (known: {', '.join(INVARIANTS)})")
    if args.budget <= 0:
        raise UserError("--budget must be > 0 seconds")
    _check_writable(Path(args.out))  # before the search: a found bug must have somewhere to go
    try:
        faults = parse_faults(args.fault)
    except UnknownFaultError as err:
        raise UserError(str(err)) from None
    profile = load_profile(args.timing) if args.timing else Profile()
    # Progress goes to stderr, and only to a terminal: piped output stays clean.
    console = Console(stderr=True)
    with Progress(
        TextColumn("exploring"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("", total=args.budget)

        def on_round(stats: SearchStats) -> None:
            progress.update(
                task,
                completed=min(stats.seconds, args.budget),
                description=f"{stats.examples} examples, {stats.iterations} iterations",
            )

        result = search(
            args.scenario,
            faults,
            args.budget,
            args.max_examples,
            args.seed,
            profile,
            args.db,
            on_round,
            skip=frozenset(args.skip),
            policy=args.policy,
            extra_checks=tuple(args.check),
        )
    stats = result.stats
    summary = (
        f"{stats.examples} examples, {stats.iterations} scheduler iterations simulated, "
        f"{stats.seconds:.1f} s"
    )
    if result.found is None:
        print(f"no violation found: {summary}")
        return 0
    found = result.found
    run = found.result
    try:
        path = counterexample.save(
            run, profile, found.draws, args.out, frozenset(args.skip), tuple(args.check)
        )
    except OSError as err:  # the folder went away mid-search: print it rather than lose it
        data = counterexample.to_json(
            run, profile, found.draws, frozenset(args.skip), tuple(args.check)
        )
        print(json.dumps({k: v for k, v in data.items() if k != "trace"}))
        raise UserError(
            f"{args.out}: cannot save the counterexample ({err.strerror}); it is printed above"
        ) from None
    check = counterexample.load(path).replay()
    if check.trace_hash != run.trace_hash:
        raise RuntimeError(
            f"overlapcheck bug: replay of {path} is not deterministic "
            f"({check.trace_hash} != {run.trace_hash})"
        )
    v = run.violations[0]
    print(f"VIOLATION {v.line()}")
    print(
        f"found after {summary}; shrunk to {len(run.scenario.requests)} request(s), "
        f"{run.iterations} iterations"
    )
    print(f"counterexample: {path}")
    if not args.no_timeline:
        _draw(run, path)
    print(f"replay: overlapcheck replay {path}")
    return 1


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create the folder ({err.strerror})") from None
    if not os.access(out, os.W_OK):
        raise UserError(f"--out {out}: the folder is not writable")


def _draw(run: counterexample.RunResult, path: Path) -> None:
    try:
        from overlapcheck.timeline.render import render_trace
    except ImportError:
        return
    # The Perfetto file must not take the counterexample's own name.
    for out in (path.with_suffix(".png"), path.with_name(f"{path.stem}.perfetto.json")):
        render_trace(run.trace, out, violation=run.violations[0], title=path.stem)
        print(f"timeline: {out}")
