"""`overlapcheck timeline`: draw a saved trace or a counterexample, or overlap vs normal."""

from __future__ import annotations

import argparse
from pathlib import Path

from overlapcheck.backends.registry import make_backend
from overlapcheck.commands.common import (
    add_scheduler_option,
    add_timing,
    make_timing,
    resolve_scenario,
    scheduler_from_args,
)
from overlapcheck.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.formats.counterexample import FORMAT as COUNTEREXAMPLE
from overlapcheck.formats.jsonfile import read_json_file
from overlapcheck.formats.trace_file import FORMAT as TRACE_FORMAT
from overlapcheck.formats.trace_file import trace_file_from_json
from overlapcheck.orchestrate.calibrate_fit import as_ran
from overlapcheck.runner import run_scenario
from overlapcheck.scheduler_spec import SchedulerSpec
from overlapcheck.timeline.model import Interval, Rendered
from overlapcheck.timeline.render import output_path, render_result, render_trace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "timeline",
        help="draw a trace or counterexample (.png, .svg, or .json for Perfetto)",
        description="Draw FILE (a trace saved by `run --trace`, or a counterexample, which is "
        "replayed) or, with --compare, a scenario run with both loops.",
    )
    p.add_argument("file", nargs="?", metavar="FILE", help="a saved trace or a counterexample")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="where to write: .png or .svg (picture), .json (Chrome trace for Perfetto)",
    )
    p.add_argument(
        "--window",
        type=parse_window,
        metavar="START:END",
        help="draw only this stretch, in µs (pictures; the JSON holds the whole run)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run --scenario with both loops (simulator), draw one above the other",
    )
    p.add_argument(
        "--compare-backends",
        action="store_true",
        help="run --scenario on a real device (--backend) and on the simulator (--timing "
        "profile, ideally from calibrate), draw the real one above",
    )
    p.add_argument(
        "--backend",
        choices=("cuda", "cpu"),
        default="cuda",
        help="with --compare-backends: the real device",
    )
    p.add_argument("--preset", help="with --compare-backends: model preset (default tiny)")
    p.add_argument("--scenario", help="with --compare: a named scenario or a .json/.toml file")
    add_scheduler_option(p, default=None)
    add_timing(p)
    p.set_defaults(main=main)


def parse_window(text: str) -> Interval:
    """`A:B` in microseconds -> (a, b) in seconds."""
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in µs, got {text!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"expected 0 <= START < END, got {text!r}")
    return a * 1e-6, b * 1e-6


def main(args: argparse.Namespace) -> int:
    out = output_path(args.output)
    if args.compare and args.compare_backends:
        raise UserError("choose one of --compare and --compare-backends")
    if args.compare_backends:
        rendered = _compare_backends(args, out)
    elif args.compare:
        rendered = _compare(args, out)
    else:
        if args.file is None:
            raise UserError(
                "timeline needs FILE (a trace or counterexample) or --compare --scenario NAME"
            )
        if args.scenario:
            raise UserError(
                "--scenario goes with --compare; to draw one run use `overlapcheck run "
                "--scenario NAME --timeline OUT`"
            )
        rendered = _draw_file(Path(args.file), out, args.window, scheduler_from_args(args))
    for panel in rendered.panels:
        print(panel.title)
    print(f"wrote {rendered.path}")
    return 0


def _compare(args: argparse.Namespace, out: Path) -> Rendered:
    from overlapcheck.timeline.compare import render_compare, run_both

    if args.file is not None:
        raise UserError("--compare runs a scenario: give --scenario NAME instead of FILE")
    if not args.scenario:
        raise UserError("--compare needs --scenario NAME")
    scenario = resolve_scenario(args.scenario)
    spec = scheduler_from_args(args)
    factory = None if spec is None else spec.factory()
    overlap, normal = run_both(scenario, lambda: make_backend("sim", make_timing(args)), factory)
    return render_compare(overlap, normal, out, args.window)


def _compare_backends(args: argparse.Namespace, out: Path) -> Rendered:
    from overlapcheck.timeline.compare import render_backends

    if args.file is not None or not args.scenario:
        raise UserError("--compare-backends runs a scenario: give --scenario NAME, not FILE")
    scenario = resolve_scenario(args.scenario)
    real_backend = make_backend(args.backend, preset=args.preset)
    run_scenario(scenario, real_backend, [])  # warm-up: kernels compile, caches fill
    real = run_scenario(scenario, real_backend, [])
    finish = getattr(getattr(real_backend, "device", None), "finish", None)
    if finish is not None:
        finish()  # every stream op's CUDA-event times are in
    # The simulator runs the work the device did: its output lengths, its message iterations.
    sim = run_scenario(
        as_ran(scenario, real.outcomes),
        make_backend("sim", make_timing(args)),
        [],
        deliveries=real.deliveries,
    )
    return render_backends(real, sim, out, args.window)


def _draw_file(
    path: Path, out: Path, window: Interval | None, scheduler: SchedulerSpec | None
) -> Rendered:
    data = read_json_file(path, "trace or counterexample")
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == TRACE_FORMAT:
        saved = trace_file_from_json(data, where=str(path))
        title = f"{saved.name}, {saved.loop} loop (saved trace)"
        violation = saved.violations[0] if saved.violations else None
        return render_trace(
            saved.trace, out, violation, title, window=window, total=saved.simulated_seconds
        )
    if kind == COUNTEREXAMPLE:
        # The scheduler the file records, unless --scheduler names another.
        return render_result(counterexample.load(path).replay(scheduler), out, window)
    raise UserError(
        f'{path}: neither a trace ("format": "{TRACE_FORMAT}") nor a '
        f'counterexample ("format": "{COUNTEREXAMPLE}")'
    )
