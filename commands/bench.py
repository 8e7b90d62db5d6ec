"""`overlapcheck bench`: measurements that print numbers (never timed tests).

Each flag picks a measurement; with none, the simulator's speed. `--json` prints one JSON object
on stdout, a key per measurement (docs/json.md); the tables go to stderr then.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from overlapcheck.bench.preemption_modes import NAMES as MODE_NAMES
from overlapcheck.commands.common import finite_positive_float, nonneg_int, positive_int


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="measurements: the simulator's speed (default), and more by flag",
    )
    p.add_argument(
        "--speed",
        action="store_true",
        help="simulated iterations per second (what runs when no other measurement is asked)",
    )
    p.add_argument(
        "--minisgl",
        action="store_true",
        help="mini-sglang's own scheduler under the simulated CUDA beside the reference on the "
        "simulator, iterations per second on one workload (needs MINISGL_PATH)",
    )
    p.add_argument(
        "--vllm",
        action="store_true",
        help="vLLM's own scheduler under the simulated CUDA beside the reference on the "
        "simulator, iterations per second on one workload (needs VLLM_PATH or vllm installed)",
    )
    p.add_argument(
        "--sglang",
        action="store_true",
        help="SGLang's own scheduler (simulated CUDA and cpu) beside the reference on the sim, "
        "iterations per second on one workload (needs SGLANG_PATH or an installed sglang)",
    )
    p.add_argument(
        "--faults",
        action="store_true",
        help="time to first failure and shrunk size per named fault (median of 5 seeds)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="--faults: each search as N streams in processes, like explore --workers "
        "(default 1); --mutants: searches at once (one mutant at one seed each), each on one "
        "core in a process of its own (default 1); --reliability: processes for the examples "
        "and the replays (default: every available core)",
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
        "(bench/mutants.py; default: all of them, or the ids given)",
    )
    p.add_argument(
        "--mutant-budget",
        type=finite_positive_float,
        default=60.0,
        metavar="S",
        help="--mutants: search seconds per mutant (default 60)",
    )
    p.add_argument(
        "--mutant-seed",
        type=nonneg_int,
        action="append",
        metavar="N",
        help="--mutants: the search's seed (repeatable: every mutant at every seed, the "
        "searches spread over --workers; default 0)",
    )
    p.add_argument(
        "--preemption-rate",
        action="store_true",
        help="the share of --examples generated workloads in which the on-demand example "
        "scheduler (examples/ondemand_scheduler.py) preempts, and its violations (must be 0)",
    )
    p.add_argument(
        "--reliability",
        action="store_true",
        help="the fixed scheduler over --examples generated workloads (violations must be 0), "
        "and --replays replays of saved counterexamples in fresh processes (every trace hash "
        "identical); exit 1 otherwise",
    )
    p.add_argument(
        "--speculative",
        action="store_true",
        help="--reliability: speculative decoding on in every generated example (draft_tokens "
        "1-4; default: in one in four)",
    )
    p.add_argument(
        "--mode",
        action="append",
        choices=[*MODE_NAMES, "all"],
        help="--reliability: --examples generated examples in this preemption mode (repeatable; "
        "all: each of them; default: the mode each example draws), one mode after the other, "
        "each with its examples per second",
    )
    p.add_argument(
        "--examples",
        type=positive_int,
        default=2000,
        metavar="N",
        help="--reliability: generated examples of the fixed scheduler, per --mode (default "
        "2000); --preemption-rate: examples of the on-demand example",
    )
    p.add_argument(
        "--replays",
        type=nonneg_int,
        default=100,
        metavar="N",
        help="--reliability: replays in all, round-robin over the counterexamples (0: none, "
        "and no counterexamples searched for; default 100)",
    )
    p.add_argument(
        "--out",
        default="counterexamples",
        metavar="DIR",
        help="--reliability: where a violating example is saved as a counterexample file, "
        "unshrunk, to replay (default counterexamples)",
    )
    p.add_argument(
        "--counterexamples",
        metavar="DIR",
        help="--reliability: replay the counterexample files in DIR (default: search one per "
        "named fault first, into a temporary folder)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout, a key per measurement; tables on stderr (default: "
        "tables on stdout)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    # With --json the tables are progress for a person (stderr); stdout is the one document.
    tables = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    report: dict[str, Any] = {"command": "bench"}
    code = 0
    with tables:
        chosen = (
            args.faults
            or args.policies
            or args.mutants is not None
            or args.reliability
            or args.minisgl
            or args.vllm
            or args.sglang
            or args.preemption_rate
        )
        if args.speed or not chosen:
            from overlapcheck.bench import sim_speed

            report["speed"] = [
                asdict(r)
                | {
                    "iterations_per_second": r.iterations_per_second,
                    "median_iterations_per_second": r.median_iterations_per_second,
                }
                for r in sim_speed.main()
            ]
        if args.minisgl:
            from overlapcheck.bench import minisgl_speed

            report["minisgl"] = [
                asdict(r) | {"iterations_per_second": r.iterations_per_second}
                for r in minisgl_speed.main()
            ]
        if args.vllm:
            from overlapcheck.bench import vllm_speed

            report["vllm"] = [
                asdict(r) | {"iterations_per_second": r.iterations_per_second}
                for r in vllm_speed.main()
            ]
        if args.sglang:
            from overlapcheck.bench import sglang_speed

            report["sglang"] = [
                asdict(r) | {"iterations_per_second": r.iterations_per_second}
                for r in sglang_speed.main()
            ]
        if args.faults:
            from overlapcheck.bench import fault_search

            report["faults"] = fault_search.main(args.workers or 1)
        if args.policies:
            from overlapcheck.bench import policies

            report["policies"] = [asdict(r) for r in policies.main()]
        if args.mutants is not None:
            from overlapcheck.bench import mutation_score

            pairs = mutation_score.main(
                args.mutants, args.mutant_budget, args.mutant_seed or [0], args.workers or 1
            )
            report["mutants"] = [
                {k: v for k, v in vars(s).items() if k != "mutant"}
                | {
                    "mutant": s.mutant.id,
                    "seed": seed,
                    "equivalent": s.mutant.equivalent,
                    "ok": s.ok,
                }
                for seed, s in pairs
            ]
            code = max(code, 0 if all(s.ok for _, s in pairs) else 1)
        if args.preemption_rate:
            from overlapcheck.bench import preemption_rate

            rate = preemption_rate.run(args.examples)
            print(
                f"preemption rate: the on-demand example over {rate.examples} generated examples: "
                f"preempted in {rate.preempted} ({rate.share:.1%}), {rate.preemptions} "
                f"preemptions, {len(rate.violations)} violation(s) (must be 0)"
            )
            for line in rate.violations[:20]:
                print(f"  {line}")
            report["preemption_rate"] = asdict(rate) | {"share": rate.share}
            code = max(code, 1 if rate.violations else 0)
        if args.reliability:
            from overlapcheck.bench import reliability
            from overlapcheck.bench.preemption_modes import parse_modes

            folder = Path(args.counterexamples) if args.counterexamples else None
            from overlapcheck.commands.paths import output_folder
            from overlapcheck.explore.parallel import available_cores

            modes = parse_modes(args.mode) if args.mode else None
            out = output_folder(args.out, "--out")  # before the run: a violation needs a home
            workers = args.workers or available_cores()
            per_mode = " per mode" if modes else ""
            print(
                f"reliability: the fixed scheduler over {args.examples} generated "
                f"examples{per_mode} on {workers} worker(s)",
                flush=True,
            )
            result = reliability.run(
                args.examples,
                workers,
                args.replays,
                folder,
                args.speculative,
                modes,
                out,
                reliability.print_mode,
            )
            reliability.print_report(result)
            report["reliability"] = result.to_json()
            code = max(code, 0 if result.ok else 1)
    if args.json:
        print(json.dumps(report, indent=1))
    return code
