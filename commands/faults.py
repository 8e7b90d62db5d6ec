"""`overlapcheck faults`: the named known bugs."""

from __future__ import annotations

import argparse
import json
import textwrap

from overlapcheck.reference.faults import FAULTS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("faults", help="list the named known bugs that --fault re-enables")
    p.add_argument(
        "--json", action="store_true", help="print a JSON list (name, summary, origin, breaks)"
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": f.name,
                        "summary": f.summary,
                        "origin": f.origin,
                        "breaks": list(f.breaks),
                        "speculative": f.speculative,
                    }
                    for f in FAULTS.values()
                ],
                indent=2,
            )
        )
        return 0
    for f in FAULTS.values():
        needs = ", needs draft_tokens > 0" if f.speculative else ""
        print(f"{f.name}  (breaks: {', '.join(f.breaks)}{needs})")
        print(textwrap.indent(textwrap.fill(f.summary, 96), "    "))
        print(f"    origin: {f.origin}\n")
    return 0
