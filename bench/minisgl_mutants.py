"""Bugs nobody told overlapcheck about, in mini-sglang's own code: one-spot mutants of its
scheduler, each searched like a user's tree, and the tree itself as the control.

    python -m overlapcheck.bench.minisgl_mutants --tree /path/to/mini-sglang-20fcd7f --budget 90
    python -m overlapcheck.bench.minisgl_mutants --tree ... --only no-wait-stream host-index

`--tree` is a mini-sglang tree at 20fcd7f with the fixes of docs/findings/mini-sglang.md
applied (bugs 1-4 and 6; bug 5 is left to upstream and a long search finds it): the anchors
below are that tree's text. Each row is one `explore` process (import, search, shrink); the verdict
to fear is "overlapcheck bug" (exit 3: the checker blamed itself for the program's fault) and the
one to read twice is a mutant reported as the control is.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.bench.minisgl_history import SEARCH_FOUND, SPEC, overlapcheck
from overlapcheck.bench.text_edits import Edit, apply_edits

SCHEDULER = "python/minisgl/scheduler/scheduler.py"
CACHE = "python/minisgl/scheduler/cache.py"


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    summary: str
    edits: tuple[Edit, ...]  # none: the control


MUTANTS = (
    Mutant("control", "the tree as given", ()),
    Mutant(
        "no-copy-sync",
        "results read before the device-to-host copy of the sampled tokens is waited for",
        ((SCHEDULER, "        copy_done.synchronize()\n", ""),),
    ),
    Mutant(
        "no-wait-stream",
        "the engine stream no longer waits for the scheduler stream's copies of a batch's inputs",
        (
            (
                SCHEDULER,
                "                self.engine.stream.wait_stream(self.stream)\n"
                "                ongoing_data",
                "                ongoing_data",
            ),
        ),
    ),
    Mutant(
        "write-over-input",
        "the sampled token is written one position early, over the last input",
        (
            (
                SCHEDULER,
                "(req.device_len if req.can_decode else -1)",
                "(req.device_len - 1 if req.can_decode else -1)",
            ),
        ),
    ),
    Mutant(
        "clamp-off-by-one",
        "max_tokens clamped to one more than the row holds",
        (
            (
                SCHEDULER,
                "max_output_len = max_seq_len - input_len\n",
                "max_output_len = max_seq_len - input_len + 1\n",
            ),
        ),
    ),
    Mutant(
        "alloc-overlap",
        "an allocation leaves its last page on the free list",
        (
            (
                CACHE,
                "        self.free_slots = self.free_slots[needed_pages:]\n",
                "        self.free_slots = self.free_slots[max(needed_pages - 1, 0):]\n",
            ),
        ),
    ),
    Mutant(
        "finished-forgot",
        "the requests finished in the last round are forgotten at once",
        (
            (
                SCHEDULER,
                "        self.finished_reqs = new_finished_reqs\n",
                "        self.finished_reqs = set()\n",
            ),
        ),
    ),
    Mutant(
        "host-index",
        "a batch's results read one row off",
        (
            (
                SCHEDULER,
                "                next_token = next_tokens_cpu[i]\n",
                "                next_token = next_tokens_cpu[i + 1]\n",
            ),
        ),
    ),
    Mutant(
        "positions-short",
        "each request's positions one short (torch resizes the out slice: the rest stays unset)",
        (
            (
                SCHEDULER,
                "            req.cached_len,\n            req.device_len,\n",
                "            req.cached_len,\n            req.device_len - 1,\n",
            ),
        ),
    ),
)


def measure(tree: Path, mutant: Mutant, budget: int, seed: int) -> tuple[str, float, str]:
    """(what the search said, its wall seconds, the found example's shape)."""
    with tempfile.TemporaryDirectory(prefix=f"overlapcheck-mutant-{mutant.name}-") as tmp:
        work = Path(tmp)
        copy = work / tree.name
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("__pycache__"))
        apply_edits(copy, mutant.edits, mutant.name)
        search = ["explore", "--scheduler", SPEC, "--budget", str(budget), "--workers", "1"]
        started = time.monotonic()
        said = overlapcheck([*search, "--seed", str(seed), "--out", "out"], copy, work)
        seconds = time.monotonic() - started
    lines = said.splitlines()
    verdict = next((ln for ln in lines if ln.startswith(("VIOLATION", "overlapcheck bug"))), "")
    if not verdict:
        verdict = next((ln for ln in lines if ln.startswith("no violation found")), said.strip())
    shape = SEARCH_FOUND.search(said)
    found = (
        f"{shape[1]} examples, shrunk to {shape[4]} request(s), {shape[5]} iterations"
        if shape
        else ""
    )
    return verdict.splitlines()[0] if verdict else "", seconds, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="mini-sglang 20fcd7f, fixed")
    parser.add_argument("--budget", type=int, default=90, help="search seconds per mutant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="these mutants only")
    args = parser.parse_args()
    if not (args.tree / SCHEDULER).is_file():
        print(f"minisgl_mutants: {args.tree} is not a mini-sglang tree", file=sys.stderr)
        return 2
    names = {m.name for m in MUTANTS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        print(f"minisgl_mutants: no mutant {', '.join(unknown)}", file=sys.stderr)
        return 2
    print("| mutant | the bug | verdict | wall | search |")
    print("| --- | --- | --- | --- | --- |")
    for mutant in MUTANTS:
        if args.only and mutant.name not in args.only:
            continue
        verdict, seconds, shape = measure(args.tree, mutant, args.budget, args.seed)
        print(f"| {mutant.name} | {mutant.summary} | {verdict} | {seconds:.0f} s | {shape} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
