"""`replay --backend cuda --ray ADDRESS`: a GPU replay's repeats spread over a Ray cluster's GPUs,
one engine per GPU, each warmed up before its judged repeats (as a single-GPU replay is)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from overlapcheck.formats.counterexample import Counterexample


def replay_on_cluster(cex: Counterexample, args: argparse.Namespace) -> int:
    """Exit status: 1 if the counterexample reproduced in any repeat, 0 if never."""
    from overlapcheck.replay.ray import replay_shares

    shares = replay_shares(
        cex.data, cex.where, args.backend, args.repeat, args.ray, args.preset, args.model
    )
    verdicts: list[dict[str, Any]] = []
    for i, share in enumerate(shares):
        for v in share["verdicts"]:
            verdicts.append({**v, "repeat": len(verdicts), "engine": i, "node": share["node"]})
    plan = shares[0]["plan"] if shares else []
    hits = sum(bool(v["reproduced"]) for v in verdicts)
    out = sys.stderr if args.json else sys.stdout
    print(f"replay plan, {len(shares)} engine(s) on the cluster:", file=out)
    for line in plan:
        print(f"  {line}", file=out)
    if args.json:
        json.dump(
            {
                "invariant": cex.invariant,
                "backend": args.backend,
                "repeats": len(verdicts),
                "engines": len(shares),
                "reproduced": hits,
                "plan": plan,
                "verdicts": verdicts,
            },
            sys.stdout,
        )
        print()
    else:
        for v in verdicts:
            what = ", ".join(v["manifested"]) or "clean"
            print(
                f"repeat {v['repeat'] + 1:>2} (engine {v['engine']} on {v['node']}): "
                f"{'REPRODUCED' if v['reproduced'] else 'not reproduced'}"
                f"  invariants: {what}  race: {v['race'] or 'none'}"
                f"  {_how(v)}"
            )
        print(
            f"{cex.invariant}: reproduced in {hits}/{len(verdicts)} repeats on {args.backend} "
            f"({len(shares)} engine(s))"
        )
    return 1 if hits else 0


def _how(verdict: dict[str, Any]) -> str:
    """What forced the order in one repeat: its gates' states, or how many sleeps applied."""
    gates = verdict.get("gates") or []
    if gates:
        return "gates: " + ", ".join(str(g["state"]) for g in gates)
    return f"sleeps applied {verdict['applied']}/{verdict['applied'] + verdict['missed']}"
