"""`overlapcheck explore`: search workloads and timings for a violation, shrink, save, replay."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.commands.common import (
    add_check_option,
    add_scheduler_option,
    load_profile,
    nonneg_int,
    positive_int,
    resolve_scenario,
    scheduler_from_args,
)
from overlapcheck.core.config import POLICIES
from overlapcheck.core.scenario import Scenario
from overlapcheck.errors import UserError
from overlapcheck.explore.parallel import (
    Live,
    Outcome,
    available_cores,
    search_streams,
)
from overlapcheck.explore.search import SearchSpec, probe_scheduler
from overlapcheck.formats import counterexample
from overlapcheck.invariants.registry import INVARIANTS
from overlapcheck.reference.faults import UnknownFaultError, parse_faults
from overlapcheck.runner import RunResult
from overlapcheck.scenarios.named import NAMED
from overlapcheck.scheduler_spec import SchedulerSpec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explore", help="search workloads and timings for a violation")
    p.add_argument(
        "--scenario",
        default="all",
        help=f"all (default: generated workloads), one of {', '.join(NAMED)}, or a scenario "
        "file (.json/.toml): variations of it",
    )
    p.add_argument(
        "--fault", action="append", default=[], metavar="NAME", help="re-enable a known bug"
    )
    p.add_argument(
        "--budget", type=float, default=60.0, metavar="SECONDS", help="time budget (default 60)"
    )
    p.add_argument("--max-examples", type=positive_int, default=100_000, help="example budget")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--out", default="counterexamples", help="where counterexamples go")
    p.add_argument(
        "--db",
        help="a Hypothesis example database directory (shared by the workers, with HypoFuzz, "
        "and by later runs; default: a temporary one)",
    )
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
    add_scheduler_option(p)
    p.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help=f"search streams in parallel processes (default: every available core, "
        f"{available_cores()} here; 1: in this process)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the search streams as Ray tasks: `local` starts a local Ray instance, an "
        "address (HOST:PORT, ray://HOST:PORT, auto) joins a cluster (pip install "
        "'overlapcheck[cluster]')",
    )
    p.add_argument(
        "--no-timeline", action="store_true", help="do not draw timelines next to counterexamples"
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    scenario: str | Scenario = args.scenario
    if scenario != "all" and scenario not in NAMED:
        scenario = resolve_scenario(args.scenario)  # a file, or one line naming the choices
    unknown = sorted(set(args.skip) - set(INVARIANTS))
    if unknown:
        raise UserError(f"unknown invariant {', '.join(unknown)} (known: {', '.join(INVARIANTS)})")
    if args.budget <= 0:
        raise UserError("--budget must be > 0 seconds")
    out = Path(args.out)
    _check_writable(out)  # before the search: a found bug must have somewhere to go
    try:
        faults = parse_faults(args.fault)
    except UnknownFaultError as err:
        raise UserError(str(err)) from None
    profile = load_profile(args.timing) if args.timing else Profile()
    spec = SearchSpec(
        scenario=scenario,
        faults=faults,
        budget=args.budget,
        max_examples=args.max_examples,
        seed=args.seed,
        profile=profile,
        database=args.db,
        skip=frozenset(args.skip),
        policy=args.policy,
        extra_checks=tuple(args.check),
        scheduler=scheduler_from_args(args) or SchedulerSpec(),
    )
    for line in probe_scheduler(spec):
        print(line, file=sys.stderr)
    outcome, unshrunk = _search(spec, args, out)
    stats = outcome.stats
    summary = (
        f"{stats.examples} examples, {stats.iterations} scheduler iterations simulated, "
        f"{stats.seconds:.1f} s"
    )
    data = outcome.found or outcome.unshrunk
    if data is None and outcome.bug is not None:
        raise outcome.bug  # the CLI saves its input and exits 3
    if data is None:
        if outcome.deaths and len(outcome.deaths) == outcome.workers:
            print(f"every worker died; nothing found in {summary}")
            return 3
        print(f"no violation found: {summary}")
        return 0
    try:
        path = counterexample.save_data(data, out)
    except OSError as err:  # the folder went away mid-search: print it rather than lose it
        print(json.dumps({k: v for k, v in data.items() if k != "trace"}))
        raise UserError(
            f"{args.out}: cannot save the counterexample ({err.strerror}); it is printed above"
        ) from None
    if unshrunk and unshrunk[0] != path:
        unshrunk[0].unlink(missing_ok=True)  # the saved one (shrunk, if it got there) replaces it
    cex = counterexample.load(path)
    run = cex.replay()
    if run.trace_hash != cex.trace_hash:
        print(
            f"overlapcheck bug: replay of {path} is not deterministic "
            f"({run.trace_hash} != {cex.trace_hash}); the file is kept, please report it",
            file=sys.stderr,
        )
        return 3
    v = cex.reproduced(run) or run.violations[0]
    print(f"VIOLATION {v.line()}")
    size = f"{len(run.scenario.requests)} request(s), {run.iterations} iterations"
    first = (outcome.unshrunk or {}).get("invariant")
    if outcome.found is not None and first is not None and first != v.invariant:
        print(
            f"(the first failure was {first}; shrinking settled on a smaller failure of "
            f"{v.invariant}: add --skip {v.invariant} to get {first} shrunk)"
        )
    if outcome.found is not None:
        print(f"found after {summary}; shrunk to {size}")
    else:
        print(f"found after {summary}; not shrunk (its worker died while shrinking): {size}")
    print(f"counterexample: {path}")
    if not args.no_timeline:
        _draw(run, path)
    print(f"replay: overlapcheck replay {path}")
    return 1


def _search(spec: SearchSpec, args: argparse.Namespace, out: Path) -> tuple[Outcome, list[Path]]:
    """Run the search where the options say, with one progress display on stderr (only on a
    terminal: piped output stays clean); notices (a worker died, the unshrunk file) always."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    unshrunk: list[Path] = []
    with Progress(
        TextColumn("exploring"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("", total=spec.budget)

        def on_progress(live: Live) -> None:
            rate = max(live.seconds, 1e-9)
            workers = f", {live.alive}/{live.workers} workers" if live.workers > 1 else ""
            progress.update(
                task,
                completed=min(live.seconds, spec.budget),
                description=f"{live.examples} examples ({live.examples / rate:.0f}/s), "
                f"{live.iterations} iterations ({live.iterations / rate:.0f}/s){workers}",
            )

        def on_notice(line: str) -> None:
            console.print(line, markup=False)

        def on_unshrunk(data: dict[str, Any]) -> None:
            try:
                unshrunk.append(counterexample.save_data(data, out, unshrunk=True))
            except OSError as err:
                on_notice(f"cannot save the unshrunk counterexample ({err.strerror})")
                return
            on_notice(f"found {data['invariant']}; saved before shrinking: {unshrunk[0]}")

        if args.ray is not None:
            from overlapcheck.explore.ray_search import search_ray

            workers = args.workers
            if workers is None and args.ray == "local":
                workers = available_cores()
            outcome = search_ray(spec, args.ray, workers, on_progress, on_unshrunk, on_notice)
        else:
            workers = args.workers or available_cores()
            outcome = search_streams(spec, workers, on_progress, on_unshrunk, on_notice)
    return outcome, unshrunk


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create the folder ({err.strerror})") from None
    if not os.access(out, os.W_OK):
        raise UserError(f"--out {out}: the folder is not writable")


def _draw(run: RunResult, path: Path) -> None:
    try:
        from overlapcheck.timeline.render import render_trace
    except ImportError:
        return
    # The Perfetto file must not take the counterexample's own name.
    for out in (path.with_suffix(".png"), path.with_name(f"{path.stem}.perfetto.json")):
        render_trace(run.trace, out, violation=run.violations[0], title=path.stem)
        print(f"timeline: {out}")
