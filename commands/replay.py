"""`overlapcheck replay FILE`: reproduce a counterexample exactly."""

from __future__ import annotations

import argparse
import json
import sys

import networkx as nx

from overlapcheck.commands.common import (
    add_model_options,
    add_scheduler_option,
    finish_with_outputs,
    positive_int,
    scheduler_from_args,
)
from overlapcheck.commands.paths import output_file
from overlapcheck.core.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import RunResult
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.hbgraph import race_subgraph
from overlapcheck.orchestrate.sim_replay import replay_on_sim


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="replay a counterexample (exit 1 when it reproduces)")
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
    add_scheduler_option(p, default=None)
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
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.hb_graph:
        output_file(args.hb_graph, "happens-before graph")
    cex = counterexample.load(args.file)
    scheduler = scheduler_from_args(args)  # overrides the one the file records
    change = cex.scheduler_change(scheduler)
    if change is not None:
        print(change, file=sys.stderr)
    if args.ray is not None and args.backend == "sim":
        raise UserError("--ray spreads the repeats of a device replay: use it with --backend cuda")
    if args.ray is not None:
        from overlapcheck.commands.ray_replay import replay_on_cluster

        return replay_on_cluster(cex.with_scheduler(scheduler), args)
    if args.backend != "sim":
        try:
            from overlapcheck.orchestrate.gpu_replay import replay_on_device
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
    result = replay_on_sim(cex, scheduler)
    hit = cex.reproduced(result)
    same_hash = result.trace_hash == cex.trace_hash
    if args.json:
        json.dump(
            {
                "reproduced": hit is not None,
                "invariant": cex.invariant,
                "trace_hash": result.trace_hash,
                "same_trace_hash": same_hash,
                "violations": [v.to_json() for v in result.violations],
            },
            sys.stdout,
        )
        print()
    elif hit is not None:
        print(f"reproduced: {hit.line()}")
        print(
            f"trace {result.trace_hash} ({'identical' if same_hash else 'DIFFERENT from the file'})"
        )
    else:
        others = "; ".join(v.line() for v in result.violations) or "none"
        print(f"did not reproduce {cex.invariant} (violations now: {others})")
    # The verdict first, flushed: a graph that cannot be written must never hide it.
    sys.stdout.flush()
    writes = [lambda: _write_hb_graph(result, hit, args.hb_graph)] if args.hb_graph else []
    return finish_with_outputs(hit is None, writes)


def _write_hb_graph(result: RunResult, hit: Violation | None, out: str) -> None:
    if hit is None or hit.invariant != "no-race":
        raise UserError("--hb-graph needs a counterexample that reproduces a no-race violation")
    graph = race_subgraph(result.trace, hit.details["first"]["seq"], hit.details["second"]["seq"])
    try:
        nx.write_graphml(graph, out)
    except OSError as err:
        raise UserError(f"{out}: {err.strerror}") from None
    print(f"happens-before graph: {out} ({graph.number_of_nodes()} operations)", file=sys.stderr)
