"""`overlapcheck replay FILE`: reproduce a counterexample exactly."""

from __future__ import annotations

import argparse
import json
import sys

import networkx as nx

from overlapcheck.commands.common import positive_int
from overlapcheck.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.hbgraph import race_subgraph
from overlapcheck.runner import RunResult


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a counterexample (exit 1 when it reproduces)")
    p.add_argument("file")
    p.add_argument(
        "--backend",
        choices=("sim", "cpu", "cuda"),
        default="sim",
        help="sim: exact replay; cuda: on a GPU with the delays injected (cpu: same path, "
        "synchronous streams, for debugging)",
    )
    p.add_argument("--repeat", type=positive_int, default=1, help="(cpu/cuda) repeats")
    p.add_argument("--preset", help="(cpu/cuda) model preset (default tiny)")
    p.add_argument("--model", help="(cpu/cuda) a Hugging Face checkpoint directory")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--hb-graph",
        metavar="OUT.graphml",
        help="for a race: write the happens-before graph around it (GraphML)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    cex = counterexample.load(args.file)
    if args.backend != "sim":
        try:
            from overlapcheck.backends.gpu.replay import replay_on_device
        except ImportError as err:
            raise UserError(
                f"--backend {args.backend} needs torch and transformers ({err.name} is missing): "
                "pip install 'overlapcheck[real]'"
            ) from None
        return replay_on_device(cex, args.backend, args.repeat, args.json, args.preset, args.model)
    result = cex.replay()
    hit = cex.reproduced(result)
    if args.hb_graph:
        _write_hb_graph(result, hit, args.hb_graph)
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
    return 1 if hit is not None else 0


def _write_hb_graph(result: RunResult, hit: Violation | None, out: str) -> None:
    if hit is None or hit.invariant != "no-race":
        raise UserError("--hb-graph needs a counterexample that reproduces a no-race violation")
    graph = race_subgraph(result.trace, hit.details["first"]["seq"], hit.details["second"]["seq"])
    try:
        nx.write_graphml(graph, out)
    except OSError as err:
        raise UserError(f"{out}: {err.strerror}") from None
    print(f"happens-before graph: {out} ({graph.number_of_nodes()} operations)", file=sys.stderr)
