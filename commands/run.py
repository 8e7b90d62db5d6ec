"""`overlapcheck run`: one scenario on one backend, all invariants on."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from overlapcheck.backends.registry import BACKENDS, make_backend
from overlapcheck.commands.common import (
    add_check_option,
    add_config_overrides,
    add_hang_timeout_option,
    add_model_options,
    add_scheduler_option,
    add_skip_option,
    add_timing,
    apply_overrides,
    finish_with_outputs,
    make_timing,
    print_hints,
    resolve_scenario,
    scheduler_from_args,
    skipped,
)
from overlapcheck.commands.paths import output_file
from overlapcheck.core.errors import UserError
from overlapcheck.formats.run_json import run_to_json
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.registry import check_specs
from overlapcheck.scenarios.named import NAMED
from overlapcheck.timeline.render import FORMATS as TIMELINE_FORMATS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run one scenario and check every invariant")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sim",
        help="sim: the SimPy GPU model; cpu/cuda: the real engine in torch",
    )
    p.add_argument(
        "--scenario",
        default="basic",
        metavar="NAME|FILE",
        help=f"a named scenario ({', '.join(NAMED)}) or a .json/.toml scenario file",
    )
    add_config_overrides(p)
    add_timing(p)
    add_check_option(p)
    add_skip_option(p)
    add_hang_timeout_option(p, "5 on the simulator, none on cpu/cuda, whose first forward compiles")
    add_scheduler_option(p)
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="record every violation (each invariant once per request) instead of stopping at "
        "the first",
    )
    add_model_options(p)
    p.add_argument(
        "--sanitize", action="store_true", help="(cuda) run under PyTorch's CUDA sanitizer"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", metavar="PATH", help="save the trace (JSON) (default: not saved)")
    p.add_argument(
        "--timeline",
        metavar="OUT",
        help="draw the timeline (.png, .svg or Perfetto .json) (default: not drawn)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    # Outputs first: a run must not end in an error its first millisecond could have reported.
    if args.trace:
        output_file(args.trace, "trace")
    if args.timeline:
        output_file(args.timeline, "timeline", TIMELINE_FORMATS)
    scenario = apply_overrides(resolve_scenario(args.scenario), args)
    if args.backend != "sim" and scenario.config.num_ranks > 1:
        raise UserError(
            f"--ranks {scenario.config.num_ranks} runs on the simulator only (--backend sim)"
        )
    options = {k: getattr(args, k) for k in ("model", "preset", "sanitize") if getattr(args, k)}
    backend = make_backend(args.backend, make_timing(args), **options)
    spec = scheduler_from_args(args) or SchedulerSpec()
    skip = skipped(args)
    result = run_scenario(
        scenario,
        backend,
        check_specs(skip, args.check) if skip or args.check else None,
        scheduler=spec,
        keep_going=args.keep_going,
        hang_timeout=args.hang_timeout,
    )
    print_hints(result.violations, result.config.loop)
    # The verdict first, flushed: an output file that cannot be written must never hide it.
    if args.json:
        json.dump(run_to_json(result), sys.stdout)
        print()
    else:
        print_human(result)
    sys.stdout.flush()
    return finish_with_outputs(result.ok, _outputs(result, args))


def _outputs(result: RunResult, args: argparse.Namespace) -> list[Callable[[], object]]:
    writes: list[Callable[[], object]] = []
    if args.trace:
        from overlapcheck.formats.trace_file import save_trace

        writes.append(lambda: save_trace(result, args.trace))
    if args.timeline:
        from overlapcheck.timeline.render import render_result

        writes.append(lambda: render_result(result, args.timeline))
    return writes


def print_human(result: RunResult) -> None:
    c = result.config
    faults = f" faults={','.join(sorted(c.faults))}" if c.faults else ""
    print(
        f"{result.scenario.name} on {result.backend}: loop={c.loop} cache={c.cache} "
        f"page_size={c.page_size} chunk={c.max_extend_tokens} policy={c.policy}{faults}"
    )
    for o in result.outcomes:
        shown = " ".join(map(str, o.tokens[:12])) + (" ..." if len(o.tokens) > 12 else "")
        if o.reason:
            shown = f"({o.reason})"
        print(f"  uid {o.uid:<4} {o.finish_reason:<10} {len(o.tokens):>3} tokens  {shown}")
    for notice in result.notices:
        print(f"notice: {notice}")
    for v in result.violations:
        print(f"VIOLATION {v.line()}")
    n = len(result.violations)
    status = "ok" if result.ok else f"FAILED ({n} violation{'s' if n > 1 else ''})"
    print(
        f"{status}: {result.iterations} iterations, "
        f"{result.simulated_seconds * 1e3:.3f} ms simulated, "
        f"{result.wall_seconds:.3f} s wall, trace {result.trace_hash[:16]}"
    )
