"""`overlapcheck replay FILE`: reproduce a counterexample exactly."""

from __future__ import annotations

import argparse
import json
import sys

from overlapcheck.errors import UserError
from overlapcheck.explore import counterexample


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a counterexample (exit 1 when it reproduces)")
    p.add_argument("file")
    p.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    p.add_argument("--repeat", type=int, default=1, help="(cuda) repeats")
    p.add_argument("--json", action="store_true")
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    cex = counterexample.load(args.file)
    if args.backend == "cuda":
        try:
            from overlapcheck.backends.gpu.replay import replay_on_gpu
        except ImportError:
            raise UserError(
                "--backend cuda needs torch, transformers and flashinfer: "
                "pip install 'overlapcheck[real,cuda]'"
            ) from None
        return int(replay_on_gpu(cex, repeat=args.repeat, as_json=args.json))
    result = cex.replay()
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
    return 1 if hit is not None else 0
