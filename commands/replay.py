"""`overlapcheck replay FILE`: reproduce a counterexample exactly."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import networkx as nx

from overlapcheck.commands.common import (
    add_hang_timeout_option,
    add_model_options,
    add_ranks_option,
    add_sarif_option,
    add_scheduler_option,
    finish_with_outputs,
    positive_int,
    print_hints,
    sarif_path,
    scheduler_from_args,
)
from overlapcheck.commands.paths import output_file
from overlapcheck.core.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.formats.sarif import write_sarif
from overlapcheck.harness.runner import RunResult
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.hbgraph import race_subgraph
from overlapcheck.replay.sim import Judgement, judge, replay_on_sim


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a counterexample: exit 1 it reproduced, 0 it no longer fires after a "
        "change, 4 it differs although nothing changed",
    )
    p.add_argument(
        "file",
        metavar="FILE",
        help="a counterexample file (JSON), as explore saves it under --out "
        "(counterexamples/<invariant>-<hash>.json)",
    )
    p.add_argument(
        "--backend",
        choices=("sim", "cpu", "cuda"),
        default="sim",
        help="sim: exact replay; cuda: on a GPU, the race's order forced by gates (else the "
        "delays injected) (cpu: same path, synchronous streams, for debugging)",
    )
    p.add_argument("--repeat", type=positive_int, default=1, metavar="N", help="(cpu/cuda) repeats")
    add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_hang_timeout_option(p, "the one the file records")
    p.add_argument(
        "--no-faults",
        action="store_true",
        help="(sim) replay with the file's named faults off, the shipped fixes on: exit 0 when "
        "the fix holds (default: the faults the file records)",
    )
    add_scheduler_option(p, default=None)
    add_ranks_option(p, "the file's")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="(cpu/cuda) spread the repeats over a Ray cluster, one engine per GPU (cuda) or "
        "per CPU (cpu); `local` starts a local Ray instance (default: no cluster, this machine)",
    )
    p.add_argument(
        "--hb-graph",
        metavar="OUT.graphml",
        help="for a race: write the happens-before graph around it (GraphML) (default: not "
        "written)",
    )
    add_sarif_option(p)
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.hb_graph:
        output_file(args.hb_graph, "happens-before graph")
    sarif = sarif_path(args)
    if sarif is not None and args.backend != "sim":
        raise UserError("--sarif goes with the simulator's replay (--backend sim)")
    cex = counterexample.load(args.file)
    scheduler = scheduler_from_args(args)  # overrides the one the file records
    change = cex.scheduler_change(scheduler)
    if change is not None:
        print(change, file=sys.stderr)
    if args.no_faults and args.backend != "sim":
        raise UserError(
            "--no-faults goes with the simulator: a device replay runs its repeats "
            "with the faults on, then off"
        )
    if args.ray is not None and args.backend == "sim":
        raise UserError("--ray spreads the repeats of a device replay: use it with --backend cuda")
    if args.ray is not None:
        from overlapcheck.commands.ray_replay import replay_on_cluster

        return replay_on_cluster(cex.with_scheduler(scheduler), args)
    if args.backend != "sim" and max(args.num_ranks or 1, cex.scenario.config.num_ranks) > 1:
        raise UserError("a replay of several ranks runs on the simulator only (--backend sim)")
    if args.backend == "cuda" and cex.scheduler.text == MINISGL:
        # mini-sglang's own scheduler on the GPU: its gate plan is kept beside the file, so a
        # fixed checkout (MINISGL_PATH) is replayed under the plan of the code that failed
        import torch

        if not torch.cuda.is_available():
            raise UserError("--backend cuda needs a CUDA device: torch sees none here")
        from overlapcheck.replay.minisgl_gpu import PLAN_SUFFIX, VERDICT_EXIT, report

        _, gpu_verdict = report(
            cex.with_scheduler(scheduler),
            Path(args.file + PLAN_SUFFIX),
            args.repeat,
            lambda line: print(line, flush=True),  # each repeat as it ends
        )
        return VERDICT_EXIT[gpu_verdict]
    if args.backend != "sim":
        try:
            from overlapcheck.commands.device_replay import replay_on_device
        except ImportError as err:
            raise UserError(
                f"--backend {args.backend} needs torch and transformers ({err.name} is missing): "
                "pip install 'overlapcheck[real]'"
            ) from None
        # The file's own scheduler sets the plan (its race is what the gates force); another
        # scheduler named on the command line is then run under that plan.
        under_test = cex.with_scheduler(scheduler)
        return replay_on_device(
            cex,
            args.backend,
            args.repeat,
            args.json,
            args.preset,
            args.model,
            under_test if under_test is not cex else None,
        )
    target = cex.without_faults() if args.no_faults else cex
    ranks = args.num_ranks
    if ranks is not None and ranks != cex.scenario.config.num_ranks:
        target = with_ranks(target, ranks)
    else:
        ranks = None
    result = replay_on_sim(target, scheduler, args.hang_timeout)
    verdict = judge(cex, result, scheduler, args.no_faults, ranks)
    code = EXIT[verdict.kind]
    if args.json:
        json.dump(
            {
                "verdict": verdict.kind,
                "exit": code,
                "reproduced": verdict.hit is not None,
                "invariant": cex.invariant,
                "trace_hash": result.trace_hash,
                "same_trace_hash": verdict.same_trace,
                "changed": list(verdict.changed),
                "changed_files": list(verdict.files),
                "violations": [v.to_json() for v in result.violations],
            },
            sys.stdout,
        )
        print()
    else:
        for line in _explain(cex, result, verdict):
            print(line)
    print_hints(result.violations, result.config.loop)
    if sarif is not None:
        write_sarif(sarif, result.violations, args.file)
    # The verdict first, flushed: a graph that cannot be written must never hide it.
    sys.stdout.flush()
    hit = verdict.hit
    writes = [lambda: _write_hb_graph(result, hit, args.hb_graph)] if args.hb_graph else []
    status = finish_with_outputs(code != 1, writes)
    return code if status == 0 else status


MINISGL = "overlapcheck.adapters.minisgl:make_scheduler"

# The exit status of each verdict (the README's table): 1 a violation, 0 the fix holds, 4 a
# replay that differs although nothing the file records changed (or where only overlapcheck's
# own code changed and nothing fires).
EXIT = {"reproduced": 1, "other": 1, "fixed": 0, "differs": 4}


def with_ranks(cex: Counterexample, ranks: int) -> Counterexample:
    """The same counterexample run with `ranks` ranks, `rank-consistent` checked among them."""
    data = dict(cex.data)
    scenario = dict(data["scenario"])
    scenario["config"] = {**scenario.get("config", {}), "num_ranks": ranks}
    data["scenario"] = scenario
    checks = list(cex.invariants)
    if ranks > 1 and "rank-consistent" not in checks:
        checks.append("rank-consistent")
    data["invariants"] = checks
    return Counterexample(data, f"{cex.where} (--ranks {ranks})")


def _explain(cex: Counterexample, result: RunResult, verdict: Judgement) -> list[str]:
    changed = "; ".join(verdict.changed)
    now = "; ".join(v.line() for v in result.violations)
    if verdict.kind == "reproduced":
        same = (
            "identical"
            if verdict.same_trace
            else f"differs from the file's {cex.trace_hash}: {changed}"
        )
        assert verdict.hit is not None
        return [f"reproduced: {verdict.hit.line()}", f"trace {result.trace_hash} ({same})"]
    if verdict.kind == "fixed":
        return [f"fixed: {cex.invariant} no longer fires, and nothing else does ({changed})"]
    if verdict.kind == "other":
        return [f"{cex.invariant} no longer fires ({changed}), but another violation does: {now}"]
    if verdict.changed:  # nothing fires, and only overlapcheck's own code changed
        return [
            f"NOT REPRODUCED: nothing fired, where the file records {cex.invariant}; the "
            f"scheduler's code is the same, but {changed}: this overlapcheck does not find it in "
            "the recorded run (search again, or replay with the overlapcheck that wrote the file)"
        ]
    if verdict.hit is not None:
        what = f"the same violation, but trace {result.trace_hash} != the file's {cex.trace_hash}"
    elif result.violations:
        what = f"{now} fired instead of {cex.invariant}"
    else:
        what = f"nothing fired, where the file records {cex.invariant}"
    unknown = (
        " (the file records no hash of the scheduler's source, so a change of it cannot be told)"
        if cex.scheduler_hash is None
        else ""
    )
    return [
        f"NOT REPRODUCED: {what}, although nothing the file records changed{unknown}: "
        "nondeterminism in the scheduler, or a bug of overlapcheck's (please report it with the "
        "file)"
    ]


def _write_hb_graph(result: RunResult, hit: Violation | None, out: str) -> None:
    if hit is None or hit.invariant != "no-race":
        raise UserError("--hb-graph needs a counterexample that reproduces a no-race violation")
    graph = race_subgraph(result.trace, hit.details["first"]["seq"], hit.details["second"]["seq"])
    try:
        nx.write_graphml(graph, out)
    except OSError as err:
        raise UserError(f"{out}: {err.strerror}") from None
    print(f"happens-before graph: {out} ({graph.number_of_nodes()} operations)", file=sys.stderr)
