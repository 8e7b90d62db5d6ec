"""`overlapcheck timeline`: draw a saved trace or a counterexample, or overlap vs normal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from overlapcheck.backends.registry import make_backend
from overlapcheck.calibrate.fit import as_ran
from overlapcheck.commands.common import (
    add_model_options,
    add_scheduler_option,
    add_timing,
    make_timing,
    resolve_scenario,
    scheduler_from_args,
)
from overlapcheck.commands.paths import output_file
from overlapcheck.core.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.formats.counterexample import FORMAT as COUNTEREXAMPLE
from overlapcheck.formats.jsonfile import read_json_file
from overlapcheck.formats.trace_file import FORMAT as TRACE_FORMAT
from overlapcheck.formats.trace_file import trace_file_from_json
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.replay.sim import replay_on_sim
from overlapcheck.scenarios.named import NAMED
from overlapcheck.timeline.model import Interval, Rendered
from overlapcheck.timeline.render import FORMATS, render_trace

# What `--json` says a file holds, by its extension.
FORMAT_NAMES = {".png": "png", ".svg": "svg", ".json": "perfetto", ".perfetto": "perfetto"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "timeline",
        help="draw a trace or counterexample (.png, .svg, or .json for Perfetto)",
        description="Draw FILE (a trace saved by `run --trace`, or a counterexample, which is "
        "replayed) or, with --compare, a scenario run with both loops.",
    )
    p.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="a trace saved by `run --trace`, or a counterexample (replayed, then drawn); "
        "required unless --compare or --compare-backends (default: none)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help=f"where to write, the format by the extension: {', '.join(FORMATS)} (.png or .svg: "
        "a picture; .json: a Chrome trace for Perfetto) (required, no default)",
    )
    p.add_argument(
        "--window",
        type=parse_window,
        metavar="START:END",
        help="draw only this stretch, in µs (pictures; the JSON holds the whole run) "
        "(default: the whole run)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run --scenario with both loops (simulator), draw one above the other (default: off)",
    )
    p.add_argument(
        "--compare-backends",
        action="store_true",
        help="run --scenario on a real device (--backend) and on the simulator (--timing "
        "profile, ideally from calibrate), draw the real one above (default: off)",
    )
    p.add_argument(
        "--backend",
        choices=("cuda", "cpu"),
        default="cuda",
        help="with --compare-backends: the real device, cuda or cpu (default: cuda)",
    )
    add_model_options(p, prefix="with --compare-backends: ")
    p.add_argument(
        "--scenario",
        metavar="NAME|FILE",
        help=f"with --compare or --compare-backends: a named scenario ({', '.join(NAMED)}) or a "
        ".json/.toml scenario file (default: none, required with them)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object describing what was written on stdout; the human lines go "
        "to stderr (default: off)",
    )
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
    out = output_file(args.output, "timeline", FORMATS)
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
        if args.seed is not None or args.timing:
            # Silently ignored they would draw another timing than the user asked for.
            raise UserError(
                "--seed and --timing go with --compare and --compare-backends: a saved trace "
                "keeps its times, a counterexample replays with the timing it recorded"
            )
        rendered = _draw_file(Path(args.file), out, args.window, scheduler_from_args(args))
    human = sys.stderr if args.json else sys.stdout
    for panel in rendered.panels:
        print(panel.title, file=human)
    print(f"wrote {rendered.path}", file=human)
    if args.json:
        json.dump(rendered_json(rendered, args.window), sys.stdout)
        print()
    return 0


def rendered_json(rendered: Rendered, window: Interval | None) -> dict[str, Any]:
    """What `timeline --json` prints: the file written and what each panel shows."""
    return {
        "output": str(rendered.path),
        "format": FORMAT_NAMES[rendered.path.suffix.lower()],
        "size_px": list(rendered.size_px) if rendered.size_in is not None else None,
        # The Perfetto JSON always holds the whole run; a window only limits pictures.
        "window_us": (
            [round(window[0] * 1e6, 3), round(window[1] * 1e6, 3)]  # to the nanosecond
            if window is not None and rendered.size_in is not None
            else None
        ),
        "panels": [
            {
                "title": p.title,
                "total_s": p.total,
                "engine_idle": p.engine_idle,
                "operations": p.operations,
                "drawn": p.boxes if rendered.size_in is not None else p.operations,
                "violation": p.violation,
                "outlined": list(p.outlined),
            }
            for p in rendered.panels
        ],
    }


def _compare(args: argparse.Namespace, out: Path) -> Rendered:
    from overlapcheck.timeline.compare import render_compare, run_both

    if args.file is not None:
        raise UserError("--compare runs a scenario: give --scenario NAME instead of FILE")
    if not args.scenario:
        raise UserError("--compare needs --scenario NAME")
    scenario = resolve_scenario(args.scenario)
    spec = scheduler_from_args(args)
    overlap, normal = run_both(scenario, lambda: make_backend("sim", make_timing(args)), spec)
    return render_compare(overlap, normal, out, args.window)


def _compare_backends(args: argparse.Namespace, out: Path) -> Rendered:
    from overlapcheck.timeline.compare import render_backends

    if args.file is not None or not args.scenario:
        raise UserError("--compare-backends runs a scenario: give --scenario NAME, not FILE")
    scenario = resolve_scenario(args.scenario)
    real_backend = make_backend(args.backend, model=args.model, preset=args.preset)
    run_scenario(scenario, real_backend, [])  # warm-up: kernels compile, caches fill
    real = run_scenario(scenario, real_backend, [])
    if args.backend != "sim":
        from overlapcheck.backends.gpu.backend import TorchBackend

        if isinstance(real_backend, TorchBackend) and real_backend.device is not None:
            real_backend.device.finish()  # every stream op's CUDA-event times are in
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
        # The scheduler the file records, unless --scheduler names another. Named after the file:
        # its scenario is a generated one, which every counterexample shares.
        cex = counterexample.load(path)
        result = replay_on_sim(cex, scheduler)
        violation = result.violations[0] if result.violations else None
        title = path.stem + _what_changed(cex, result, scheduler)
        return render_trace(
            result.trace, out, violation, title, window=window, total=result.simulated_seconds
        )
    raise UserError(
        f'{path}: neither a trace ("format": "{TRACE_FORMAT}") nor a '
        f'counterexample ("format": "{COUNTEREXAMPLE}")'
    )


def _what_changed(
    cex: counterexample.Counterexample, result: RunResult, scheduler: SchedulerSpec | None
) -> str:
    """What the title adds when the run drawn is not the one the file recorded: the drawing is
    of the code as it is now, and a reader must not take it for the recorded failure."""
    if scheduler is not None and scheduler != cex.scheduler:
        what = f"scheduler {scheduler.text}, not the recorded {cex.scheduler.text}"
    else:
        now = cex.scheduler.fingerprint(result.scheduler) if cex.code is not None else None
        files = cex.code_changes(now)
        if not files:
            return ""
        what = f"the scheduler's code changed since it was saved: {', '.join(files)}"
    fired = "" if cex.reproduced(result) is not None else f"; {cex.invariant} no longer fires"
    note = f" (replayed with {what}{fired})"
    print(f"note: drawing the replay of {cex.where}{note}", file=sys.stderr)
    return note
