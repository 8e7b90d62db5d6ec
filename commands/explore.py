"""`overlapcheck explore`: search workloads and timings for a violation, shrink, save, replay.

A found failure is on disk from the moment it is found (see `explore/keeper.py`); Ctrl-C or the
budget while shrinking keeps the smallest one so far as the counterexample, and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.commands.common import (
    add_check_option,
    add_hang_timeout_option,
    add_ranks_option,
    add_sarif_option,
    add_scheduler_option,
    add_skip_option,
    finite_positive_float,
    load_profile,
    nonneg_int,
    positive_int,
    print_hints,
    resolve_scenario,
    sarif_path,
    scheduler_from_args,
    skipped,
)
from overlapcheck.commands.paths import output_folder
from overlapcheck.core.config import LOOP_KINDS, POLICIES
from overlapcheck.core.errors import UserError
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.coverage import SearchCoverage, combined, data_folder, scheduler_files
from overlapcheck.explore.keeper import FailureKeeper
from overlapcheck.explore.parallel import (
    Listener,
    Live,
    Outcome,
    available_cores,
    search_streams,
)
from overlapcheck.explore.resume import resumed_spec
from overlapcheck.explore.search import (
    CUT_BUDGET,
    CUT_INTERRUPTED,
    CUT_NONDETERMINISTIC,
    SearchSpec,
    basic_run,
    probe_scheduler,
)
from overlapcheck.formats import counterexample
from overlapcheck.formats.sarif import write_sarif
from overlapcheck.harness.runner import DEFAULT_HANG_TIMEOUT, RunResult
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.reference.faults import UnknownFaultError, parse_faults
from overlapcheck.replay.sim import ADDRESS_DEPENDENT, ADDRESS_NOTE, replay_on_sim
from overlapcheck.scenarios.named import NAMED

DB_FOLDER = ".examples-db"  # under --out: see the --db help


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explore", help="search workloads and timings for a violation")
    p.add_argument(
        "--scenario",
        default="all",
        help=f"all (default: generated workloads), one of {', '.join(NAMED)}, or a scenario "
        "file (.json/.toml): variations of it",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="re-enable a known bug (repeatable; default none: the scheduler as shipped; "
        "see `overlapcheck faults`)",
    )
    p.add_argument(
        "--budget",
        type=finite_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="wall seconds for the whole search, shrinking included: a shrink the budget cuts "
        "short keeps the smallest failure so far (default 60)",
    )
    p.add_argument(
        "--max-examples",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="examples at most, over all workers (default 100000)",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="the search's seed (default 0)")
    p.add_argument(
        "--out",
        default="counterexamples",
        metavar="DIR",
        help="where counterexamples go (default counterexamples)",
    )
    p.add_argument(
        "--db",
        metavar="DIR",
        help="the Hypothesis example database: saved failures a rerun replays first, shared by "
        f"the workers (processes and Ray), by HypoFuzz and by later runs (default: "
        f"OUT/{DB_FOLDER}, beside the counterexamples it reproduces; `none`: no database)",
    )
    p.add_argument(
        "--timing", metavar="FILE", help="nominal timing profile (JSON; default: the built-in one)"
    )
    add_skip_option(p)
    p.add_argument(
        "--policy", choices=POLICIES, help="pin the queue policy (default: drawn per example)"
    )
    p.add_argument(
        "--loop",
        choices=LOOP_KINDS,
        help="pin the scheduler loop (default: drawn per example; a scheduler with only a "
        "normal loop: --loop normal)",
    )
    add_check_option(p)
    add_hang_timeout_option(p, f"{DEFAULT_HANG_TIMEOUT:g}")
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
        help="run the search streams as Ray tasks (default: no Ray): `local` starts a local Ray "
        "instance, an address (HOST:PORT, ray://HOST:PORT, auto) joins a cluster (pip install "
        "'overlapcheck[cluster]')",
    )
    p.add_argument(
        "--resume",
        metavar="FILE",
        help="go on with the search that saved the counterexample FILE (its scenario, faults, "
        "checks, scheduler and timing profile), replaying its failure first and shrinking on "
        "from it: for a shrink that the budget or Ctrl-C cut short (default: a new search)",
    )
    p.add_argument(
        "--coverage",
        action="store_true",
        help="measure which lines of the scheduler's code the search ran (coverage.py: pip "
        "install 'overlapcheck[coverage]'): a summary at the end, coverage.json and "
        "coverage-html/ beside the counterexamples (default: not measured)",
    )
    p.add_argument(
        "--no-timeline",
        action="store_true",
        help="do not draw timelines next to counterexamples (default: draw them)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout at the end (docs/json.md); the human "
        "lines go to stderr (default: human lines on stdout)",
    )
    add_sarif_option(p)
    add_ranks_option(
        p,
        "the scenario file's; 2 with a fault that needs ranks (local-extend-flag); else 1",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    out = output_folder(args.out, "--out")  # before the search: a found bug must have a home
    sarif = sarif_path(args)
    spec = _spec(args, out)
    # With --json, stdout is the one JSON document: every human line goes to stderr.
    human = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=human, flush=True)

    if args.coverage and args.ray is not None:
        raise UserError("--coverage measures local search streams: drop --ray")
    # With --coverage the probe's run is also the one that finds the scheduler's files.
    probed = basic_run(spec) if args.coverage else None
    for line in probe_scheduler(spec, probed):
        print(line, file=sys.stderr)
    keeper = FailureKeeper(out, lambda line: print(line, file=sys.stderr, flush=True))
    measured: SearchCoverage | None = None
    if probed is not None:
        files = scheduler_files(spec, probed)
        with data_folder() as data:
            spec = replace(spec, coverage_files=tuple(p for p, _ in files), coverage_data=data)
            outcome = _search(spec, args, keeper)
            measured = combined(data, files, out)
    else:
        outcome = _search(spec, args, keeper)
    report = _Report(args.json, outcome, keeper)
    if measured is not None:
        report.coverage = measured.to_json()
        for line in measured.lines():
            say(line)
    stats = outcome.stats
    summary = (
        f"{stats.examples} examples, {stats.iterations} scheduler iterations simulated, "
        f"{stats.seconds:.1f} s"
    )
    found = outcome.counterexample
    if found is None and outcome.bug is not None:
        raise outcome.bug  # the CLI saves its input and exits 3
    if found is None:
        return _nothing_found(outcome, report, summary, sarif, say)
    try:
        path = keeper.finish(found)
    except OSError as err:
        # The folder went away or filled up mid-search: print the counterexample rather than
        # lose it, and still exit 1: a violation was found, and a script testing for 1 must see it.
        print(json.dumps({k: v for k, v in found.data.items() if k != "trace"}), file=human)
        print(
            f"overlapcheck: error: {args.out}: cannot save the counterexample "
            f"({err.strerror}); it is printed above",
            file=sys.stderr,
        )
        report.violation = found.violation
        return report.end(1)
    report.counterexample = path
    return _found(args, spec, outcome, report, path, summary, sarif, say)


def _spec(args: argparse.Namespace, out: Path) -> SearchSpec:
    """The search the command line asks for (or the one `--resume` takes from its file)."""
    scenario: str | Scenario = args.scenario
    if scenario != "all" and scenario not in NAMED:
        scenario = resolve_scenario(args.scenario)  # a file, or one line naming the choices
    skip = skipped(args, run_ending=True)
    database = _database(args.db, out)
    try:
        faults = parse_faults(args.fault)
    except UnknownFaultError as err:
        raise UserError(str(err)) from None
    if isinstance(scenario, Scenario):  # --fault adds to the faults the file switches on
        faults |= scenario.config.faults
    profile = load_profile(args.timing) if args.timing else Profile()
    spec = SearchSpec(
        scenario=scenario,
        faults=faults,
        budget=args.budget,
        max_examples=args.max_examples,
        seed=args.seed,
        profile=profile,
        database=database,
        skip=skip,
        policy=args.policy,
        loop=args.loop,
        ranks=args.num_ranks,
        hang_timeout=DEFAULT_HANG_TIMEOUT if args.hang_timeout is None else args.hang_timeout,
        extra_checks=tuple(args.check),
        scheduler=scheduler_from_args(args) or SchedulerSpec(),
    )
    if args.resume is None:
        return spec
    given = [
        flag
        for flag, value in (
            ("--scenario", args.scenario != "all"),
            ("--fault", args.fault),
            ("--skip", args.skip),
            ("--check", args.check),
            ("--policy", args.policy),
            ("--timing", args.timing),
            ("--scheduler", args.scheduler not in (None, "reference")),
            ("--ranks", args.num_ranks is not None),
        )
        if value
    ]
    if given:
        raise UserError(f"--resume takes the search from its file: drop {', '.join(given)}")
    return resumed_spec(args.resume, spec)


def _nothing_found(
    outcome: Outcome, report: _Report, summary: str, sarif: Path | None, say: Callable[[str], None]
) -> int:
    if outcome.interrupted:
        print(f"overlapcheck: interrupted; nothing found in {summary}", file=sys.stderr)
        return report.end(130)
    if outcome.deaths and len(outcome.deaths) == outcome.workers:
        say(f"every worker died; nothing found in {summary}")
        return report.end(3)
    say(f"no violation found: {summary}")
    if sarif is not None:
        write_sarif(sarif, [])
    return report.end(0)


def _found(
    args: argparse.Namespace,
    spec: SearchSpec,
    outcome: Outcome,
    report: _Report,
    path: Path,
    summary: str,
    sarif: Path | None,
    say: Callable[[str], None],
) -> int:
    """The saved counterexample, replayed and told: the violation, how it was found and shrunk,
    where it is, and how to replay it and move on past it."""
    stats = outcome.stats
    cex = counterexample.load(path)
    run = replay_on_sim(cex)
    if run.trace_hash != cex.trace_hash and cex.invariant == ADDRESS_DEPENDENT:
        # Ranks that order by object addresses diverge by them, and rank 0's own trace then
        # depends on them too: the replay's trace differs, and it may not diverge at all.
        if cex.reproduced(run) is None:
            say(f"VIOLATION [{cex.invariant}] (saved in {path}); {ADDRESS_NOTE}")
            return report.end(1)
        print(f"note: the replay diverged with another trace; {ADDRESS_NOTE}", file=sys.stderr)
    elif run.trace_hash != cex.trace_hash and (
        outcome.cut == CUT_NONDETERMINISTIC or not spec.scheduler.ours
    ):
        # A scheduler of the user's whose runs differ (Hypothesis may have said so already):
        # the violation was seen and is saved; the replay cannot promise the same trace.
        note = (
            f"the replay of {path} gave another trace ({run.trace_hash} != {cex.trace_hash}): "
            "the scheduler's runs are not the same twice (an order by object addresses, a "
            "clock, a global random source?), or overlapcheck has a bug"
        )
        print(f"note: {note}", file=sys.stderr)
        if cex.reproduced(run) is None:
            say(f"VIOLATION [{cex.invariant}] (saved in {path}); not seen again on its replay")
            return report.end(1)
    elif run.trace_hash != cex.trace_hash:
        print(
            f"overlapcheck bug: replay of {path} is not deterministic "
            f"({run.trace_hash} != {cex.trace_hash}); the file is kept, please report it",
            file=sys.stderr,
        )
        return report.end(3)
    v = cex.reproduced(run) or run.violations[0]
    report.violation = v.to_json() | {"line": v.line()}
    if sarif is not None:
        write_sarif(sarif, [v], str(path))
    say(f"VIOLATION {v.line()}")
    print_hints([v], run.config.loop)
    size = f"{len(run.scenario.requests)} request(s), {run.iterations} iterations"
    first = outcome.unshrunk.invariant if outcome.unshrunk is not None else None
    if outcome.found is not None and first is not None and first != v.invariant:
        say(
            f"(the first failure was {first}; shrinking settled on a smaller failure of "
            f"{v.invariant}: add --skip {v.invariant} to get {first} shrunk)"
        )
    smaller = f"{stats.smaller} smaller failure(s) found while shrinking"
    cut = {
        CUT_INTERRUPTED: ("shrinking interrupted", "shrinking interrupted"),
        CUT_BUDGET: (
            f"shrinking stopped at the --budget of {args.budget:g} s",
            "shrinking cut short by the budget",
        ),
        CUT_NONDETERMINISTIC: (
            "the scheduler did not run the same example the same way twice (an order by object "
            "addresses, a clock or a global random source?), so Hypothesis could not shrink it",
            "not shrunk by Hypothesis: the scheduler's runs are nondeterministic",
        ),
    }.get(outcome.cut or "")
    if cut is not None:
        print(
            f"{cut[0]} after {smaller}; the smallest so far is the counterexample: {path}",
            file=sys.stderr,
            flush=True,
        )
        say(f"found after {summary}; {cut[1]} at {size}")
    elif outcome.found is not None:
        say(f"found after {summary}; shrunk to {size}")
    else:
        say(f"found after {summary}; its worker died while shrinking; the smallest so far: {size}")
    say(f"counterexample: {path}")
    if not args.no_timeline:
        report.timelines = _draw(run, path, say)
    say(f"replay: overlapcheck replay {path}")
    # The invariant this search found, not a guess: skipping another would find it again.
    say(f"next: add --skip {v.invariant} to this command to hide it and look for another finding")
    return report.end(1)


def _database(db: str | None, out: Path) -> str | None:
    """`--db`, or the default beside the counterexamples (an absolute path: Ray tasks and worker
    processes open it from wherever they run). A regular file there is refused: Hypothesis would
    silently keep nothing."""
    if db is not None and db.lower() == "none":
        return None
    path = Path(db) if db is not None else out / DB_FOLDER
    if path.exists() and not path.is_dir():
        option = "--db" if db is not None else f"--out {out}: the example database"
        raise UserError(f"{option} {path}: is a file, not a folder")
    if db is not None:
        output_folder(db, "--db")
    return str(path.resolve())


class _Report:
    """`--json`: what explore prints on stdout at the end (schema: docs/json.md)."""

    def __init__(self, enabled: bool, outcome: Outcome, keeper: FailureKeeper) -> None:
        self.enabled = enabled
        self.outcome = outcome
        self.keeper = keeper
        self.counterexample: Path | None = None
        self.violation: dict[str, Any] | None = None
        self.timelines: list[Path] = []
        self.coverage: dict[str, Any] | None = None  # `--coverage`

    def end(self, code: int) -> int:
        if self.enabled:
            print(json.dumps(self.to_json(code), indent=1), flush=True)
        return code

    def to_json(self, code: int) -> dict[str, Any]:
        o, stats = self.outcome, self.outcome.stats
        data = o.counterexample
        unshrunk = None
        if o.unshrunk is not None:
            unshrunk = {
                "path": str(self.keeper.path) if self.keeper.path is not None else None,
                "kept": self.keeper.kept,
                "invariant": o.unshrunk.invariant,
                "size": o.unshrunk.size,
            }
        return {
            "command": "explore",
            "exit": code,
            "found": data is not None,
            "interrupted": o.interrupted,
            "shrink": None if data is None else (o.cut or ("done" if o.found else "worker-died")),
            "stats": {
                "examples": stats.examples,
                "iterations": stats.iterations,
                "seconds": round(stats.seconds, 3),
                "workers": o.workers,
                "examples_to_failure": stats.examples_to_failure,
                "seconds_to_failure": stats.first_failure,
                "smaller_found": stats.smaller,
                "replaced": self.keeper.replaced,
                "deaths": list(o.deaths),
            },
            "counterexample": str(self.counterexample) if self.counterexample else None,
            "unshrunk": unshrunk,
            "violation": self.violation,
            "size": data.size if data is not None else None,
            "timelines": [str(p) for p in self.timelines],
            "replay": f"overlapcheck replay {self.counterexample}" if self.counterexample else None,
            "coverage": self.coverage,
        }


def local_workers(asked: int | None) -> int:
    """Search streams on this machine: one per available core unless `--workers` says fewer.
    More processes than cores only share them (each starting Python, Hypothesis and the
    simulator first: a hundred spent the whole budget starting), so more is capped, with one
    notice line."""
    cores = available_cores()
    if asked is None:
        return cores
    if asked > cores:
        print(
            f"notice: --workers {asked} is more than the {cores} available core(s); using {cores}",
            file=sys.stderr,
            flush=True,
        )
        return cores
    return asked


def _search(spec: SearchSpec, args: argparse.Namespace, keeper: FailureKeeper) -> Outcome:
    """Run the search where the options say, with one progress display on stderr (only on a
    terminal: piped output stays clean); notices (a worker died, a failure found and being
    shrunk) always, printed above the display and flushed at once."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
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
            shrinking = ""
            if keeper.first_found is not None:
                invariant = keeper.first_found.invariant
                shrinking = f"; shrinking {invariant}: {keeper.replaced} smaller"
            progress.update(
                task,
                completed=min(live.seconds, spec.budget),
                description=f"{live.examples} examples ({live.examples / rate:.0f}/s), "
                f"{live.iterations} iterations ({live.iterations / rate:.0f}/s){workers}"
                f"{shrinking}",
            )

        def on_notice(line: str) -> None:
            console.print(line, markup=False)
            console.file.flush()

        keeper.notice = on_notice
        listener = Listener(on_progress, keeper.first, keeper.smaller, on_notice)
        if args.ray is not None:
            from overlapcheck.explore.ray_search import search_ray

            workers = args.workers
            if workers is None and args.ray == "local":
                workers = available_cores()
            return search_ray(spec, args.ray, workers, listener)
        return search_streams(spec, local_workers(args.workers), listener)


def _draw(run: RunResult, path: Path, say: Callable[[str], None]) -> list[Path]:
    try:
        from overlapcheck.timeline.render import render_trace
    except ImportError:
        return []
    drawn = []
    # The Perfetto file ends in .perfetto, not .json: `replay counterexamples/no-race-*.json`
    # must match the counterexample alone.
    for out in (path.with_suffix(".png"), path.with_suffix(".perfetto")):
        render_trace(run.trace, out, violation=run.violations[0], title=path.stem)
        say(f"timeline: {out}")
        drawn.append(out)
    return drawn
