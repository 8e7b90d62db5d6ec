"""Bugs nobody told overlapcheck about, in mini-sglang's own code: one-spot mutants of its
scheduler, each searched like a user's tree, and the tree itself as the control.

    python -m overlapcheck.bench.minisgl_mutants --tree /path/to/mini-sglang-20fcd7f --budget 90
    python -m overlapcheck.bench.minisgl_mutants --tree ... --only no-wait-stream host-index
    python -m overlapcheck.bench.minisgl_mutants --tree ... --set blind --workers 16 --out DIR

`--tree` is a mini-sglang tree at 20fcd7f with the fixes of docs/findings/mini-sglang.md
applied (bugs 1-4 and 6; bug 5 is left to upstream and a long search finds it): the anchors
below are that tree's text. Each row is one `explore` process (import, search, shrink); the verdict
to fear is "overlapcheck bug" (exit 3: the checker blamed itself for the program's fault) and the
one to read twice is a mutant reported as the control is. Two sets: `first` (default), written by
the people who built the checks, and `blind`, a second set over all the code the adapter runs.
Each mutant's counterexample is replayed on the tree without the mutant: "the tree's own" is a
finding of the tree's bug (bug 5), not of the mutant (the search stopped there first); such a
mutant is searched again past that invariant (`--skip`, the next seed), up to three searches,
and its row is the last one's. `--out DIR` keeps each search's counterexamples
(`DIR/<mutant>/out`, `.../past1`, `.../past2`).
`--workers N` runs N mutants' searches at once and prints the rows in the set's order at the end.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.bench.minisgl_history import SEARCH_FOUND, SPEC, overlapcheck
from overlapcheck.bench.text_edits import Edit, apply_edits

SCHEDULER = "python/minisgl/scheduler/scheduler.py"
CACHE = "python/minisgl/scheduler/cache.py"
PREFILL = "python/minisgl/scheduler/prefill.py"
DECODE = "python/minisgl/scheduler/decode.py"
RADIX = "python/minisgl/kvcache/radix_cache.py"
CORE = "python/minisgl/core.py"
GRAPH = "python/minisgl/engine/graph.py"


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


# The second set, written without looking at what the checks look for: mistakes a contributor
# could commit anywhere in the code the adapter runs (the scheduler's managers, the radix cache,
# `Req`, the graph runner's padding). `pageable-prefix-copy` is meant to be harmless (a
# non-blocking copy from pageable memory is synchronous): a finding there is a false alarm.
BLIND = (
    MUTANTS[0],
    Mutant(
        "wait-reversed",
        "the overlap loop makes the scheduler stream wait for the engine stream, not the other"
        " way round, before launching a batch",
        (
            (
                SCHEDULER,
                "                self.engine.stream.wait_stream(self.stream)\n"
                "                ongoing_data",
                "                self.stream.wait_stream(self.engine.stream)\n"
                "                ongoing_data",
            ),
        ),
    ),
    Mutant(
        "release-no-wait",
        "freed rows are handed out again without the scheduler stream waiting for the engine"
        " stream (copy_done was thought to cover it)",
        (
            (
                SCHEDULER,
                "        if self.rows_pending:\n"
                "            self.stream.wait_stream(self.engine.stream)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "staging-reuse",
        "the page-table write stages its indices in one pinned buffer kept by the cache manager,"
        " rewritten by the next allocation while the last copy may still read it",
        (
            (
                CACHE,
                "        self.page_size = page_size\n",
                "        self.page_size = page_size\n"
                "        self.staging = torch.empty(\n"
                "            (2, num_pages * page_size), dtype=torch.int64, pin_memory=True\n"
                "        )\n",
            ),
            (
                CACHE,
                "_write_page_table(self.page_table, allocated, allocation_info, self.page_size)",
                "_write_page_table(\n"
                "                self.page_table, allocated, allocation_info, self.page_size,"
                " self.staging\n"
                "            )",
            ),
            (
                CACHE,
                "    page_size: int,\n) -> None:\n"
                "    needed_tokens = len(allocated)\n"
                "    table_idx_host = torch.empty(needed_tokens, dtype=torch.int64,"
                " pin_memory=True)\n"
                "    positions_host = torch.empty(needed_tokens, dtype=torch.int64,"
                " pin_memory=True)\n",
                "    page_size: int,\n    staging: torch.Tensor,\n) -> None:\n"
                "    needed_tokens = len(allocated)\n"
                "    table_idx_host = staging[0, :needed_tokens]\n"
                "    positions_host = staging[1, :needed_tokens]\n",
            ),
        ),
    ),
    Mutant(
        "pageable-prefix-copy",
        "a chunk's prompt ids copied to the token pool from pageable memory (harmless: the copy"
        " is then synchronous)",
        (
            (
                PREFILL,
                "device_ids.copy_(pending_req.input_ids[_slice].pin_memory(), non_blocking=True)",
                "device_ids.copy_(pending_req.input_ids[_slice], non_blocking=True)",
            ),
        ),
    ),
    Mutant(
        "abort-chunked-leak",
        "aborting a request still being prefilled in chunks drops it without freeing its row"
        " and pages",
        ((PREFILL, "                return req.chunked_req\n", "                return None\n"),),
    ),
    Mutant(
        "decode-abort-stays",
        "an aborted running request is freed but stays in the decode set",
        ((DECODE, "                self.running_reqs.remove(req)\n", ""),),
    ),
    Mutant(
        "filter-drops-running",
        "launching a batch keeps only that batch's requests as the running set (a prefill batch"
        " forgets those decoding)",
        (
            (
                DECODE,
                "{req for req in self.running_reqs.union(reqs) if req.can_decode}",
                "{req for req in reqs if req.can_decode}",
            ),
        ),
    ),
    Mutant(
        "split-refcount",
        "splitting a radix node leaves the new parent's reference count at 0 though its child"
        " is locked",
        ((RADIX, "        new_node.ref_count = self.ref_count\n", ""),),
    ),
    Mutant(
        "evict-keeps-size",
        "eviction does not count evicted nodes out of the evictable size",
        (
            (
                RADIX,
                "            self.evictable_size -= node.length\n            parent",
                "            parent",
            ),
        ),
    ),
    Mutant(
        "match-whole-prompt",
        "the prefix match may cover the whole prompt (its last token is not held back)",
        (
            (
                CACHE,
                "match_prefix(req.input_ids[: input_len - 1])",
                "match_prefix(req.input_ids[:input_len])",
            ),
        ),
    ),
    Mutant(
        "first-page-floor",
        "a request whose cached part ends inside a page gets that page allocated again",
        (
            (
                CACHE,
                "first_page = div_ceil(req.cached_len, self.page_size)",
                "first_page = req.cached_len // self.page_size",
            ),
        ),
    ),
    Mutant(
        "free-cached-tail",
        "a finished request frees from the old cached length, the pages it just inserted into"
        " the radix tree included",
        (
            (
                CACHE,
                "            self._free(page_indices[new_handle.cached_len :])\n",
                "            self._free(page_indices[cached_len:])\n",
            ),
        ),
    ),
    Mutant(
        "reserve-no-output",
        "admission reserves a request's prompt but not its output against the next requests of"
        " the batch",
        (
            (
                PREFILL,
                "self.reserved_size += remain_len + pending_req.output_len",
                "self.reserved_size += remain_len",
            ),
        ),
    ),
    Mutant(
        "input-rows-unpadded",
        "a padded batch's token mapping filled for the real requests only (the dummies' part of"
        " the pinned buffer stays unset)",
        (
            (
                SCHEDULER,
                "    for req in batch.padded_reqs:\n"
                "        length = req.extend_len\n"
                "        mapping_host",
                "    for req in batch.reqs:\n        length = req.extend_len\n        mapping_host",
            ),
        ),
    ),
    Mutant(
        "complete-one-order",
        "completing a round advances device_len before cached_len takes it (the new token"
        " counts as cached)",
        (
            (
                CORE,
                "        self.cached_len = self.device_len\n        self.device_len += 1\n",
                "        self.device_len += 1\n        self.cached_len = self.device_len\n",
            ),
        ),
    ),
    Mutant(
        "graph-pad-strict",
        "a decode batch padded to the first captured size above its own (none above the largest)",
        (
            (
                GRAPH,
                "next(bs for bs in self.graph_bs_list if bs >= batch.size)",
                "next(bs for bs in self.graph_bs_list if bs > batch.size)",
            ),
        ),
    ),
    Mutant(
        "max-output-zero",
        "a prompt of exactly max_seq_len tokens is admitted (with max_tokens clamped to 0)",
        (
            (
                SCHEDULER,
                "            if max_output_len <= 0:\n",
                "            if max_output_len < 0:\n",
            ),
        ),
    ),
)
SETS = {"first": MUTANTS, "blind": BLIND}


# What replaying a mutant's counterexample on the tree without the mutant says (`replay`'s first
# word): `fixed` is the mutant's own finding; `reproduced` is a bug of the tree itself (bug 5).
ON_TREE = {"fixed": "the mutant's", "reproduced": "the tree's own"}
INVARIANT = re.compile(r"^VIOLATION \[([\w-]+)\]")


@dataclass(frozen=True, slots=True)
class Row:
    """One mutant's searches: the verdict, wall seconds, the found example's shape and whose
    bug it is (its counterexample replayed on the tree without the mutant)."""

    verdict: str
    seconds: float
    shape: str
    whose: str


def _search(
    tree: Path, copy: Path, work: Path, out: str, args: tuple[int, int, list[str]], replay: bool
) -> tuple[Row, str]:
    """One `explore` of `copy` (budget, seed, skipped invariants), its counterexample replayed
    on `tree` when `replay`: the row and the invariant it found ("" when none)."""
    budget, seed, skips = args
    search = ["explore", "--scheduler", SPEC, "--budget", str(budget), "--workers", "1"]
    search += ["--seed", str(seed), "--out", out, *(a for s in skips for a in ("--skip", s))]
    started = time.monotonic()
    said = overlapcheck(search, copy, work)
    seconds = time.monotonic() - started
    lines = said.splitlines()
    verdict = next((ln for ln in lines if ln.startswith(("VIOLATION", "overlapcheck bug"))), "")
    if not verdict:
        verdict = next((ln for ln in lines if ln.startswith("no violation found")), said.strip())
    verdict = verdict.splitlines()[0] if verdict else ""
    shape = SEARCH_FOUND.search(said)
    found = (
        f"{shape[1]} examples, shrunk to {shape[4]} request(s), {shape[5]} iterations"
        if shape
        else ""
    )
    files = sorted(p for p in (work / out).glob("*.json") if "unshrunk" not in p.name)
    whose = ""
    if files and replay:
        again = overlapcheck(["replay", str(files[0])], tree.resolve(), work).strip()
        first = again.splitlines()[0] if again else "nothing printed"
        whose = ON_TREE.get(first.split(":")[0], first)
    hit = INVARIANT.match(verdict)
    return Row(verdict, seconds, found, whose), hit[1] if hit else ""


# Searches of one mutant past the tree's own findings: at most this many in all.
ROUNDS = 3


def measure(tree: Path, mutant: Mutant, budget: int, seed: int, keep: Path | None = None) -> Row:
    """The mutant searched like a user's tree. When what it finds is the tree's own bug (bug 5:
    the search stopped there before reaching the mutant), it is searched again past that
    invariant (`--skip`, as a user who knows the tree's bug would; the next seed, so that the
    examples already run are not run again), up to ROUNDS searches; the row says which it looked
    past. The counterexample files are copied to `keep / mutant.name / <search>` when `keep` is
    given."""
    with tempfile.TemporaryDirectory(prefix=f"overlapcheck-mutant-{mutant.name}-") as tmp:
        work = Path(tmp)
        copy = work / tree.name
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("__pycache__"))
        apply_edits(copy, mutant.edits, mutant.name)
        replay = bool(mutant.edits)
        skips: list[str] = []
        seconds = 0.0
        for round_ in range(ROUNDS):
            out = "out" if round_ == 0 else f"past{round_}"
            row, invariant = _search(tree, copy, work, out, (budget, seed + round_, skips), replay)
            seconds += row.seconds
            if row.whose != ON_TREE["reproduced"] or not invariant or round_ == ROUNDS - 1:
                break
            skips = [*skips, invariant]
        if keep is not None:
            for found in sorted(work.glob("*/*.json")):
                if found.parent.name == "out" or found.parent.name.startswith("past"):
                    (keep / mutant.name / found.parent.name).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(found, keep / mutant.name / found.parent.name / found.name)
    looked = f"(past the tree's {', '.join(skips)}) " if skips else ""
    return Row(looked + row.verdict, seconds, row.shape, row.whose)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="mini-sglang 20fcd7f, fixed")
    parser.add_argument("--set", choices=sorted(SETS), default="first", help="which mutants")
    parser.add_argument("--budget", type=int, default=90, help="search seconds per mutant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="these mutants only")
    parser.add_argument(
        "--workers", type=int, default=1, help="mutants searched at once (one core each)"
    )
    parser.add_argument("--out", type=Path, help="keep each mutant's counterexamples here")
    args = parser.parse_args()
    if not (args.tree / SCHEDULER).is_file():
        print(f"minisgl_mutants: {args.tree} is not a mini-sglang tree", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("minisgl_mutants: --workers must be at least 1", file=sys.stderr)
        return 2
    chosen = SETS[args.set]
    unknown = sorted(set(args.only or ()) - {m.name for m in chosen})
    if unknown:
        print(
            f"minisgl_mutants: no mutant {', '.join(unknown)} in --set {args.set}", file=sys.stderr
        )
        return 2
    mutants = [m for m in chosen if not args.only or m.name in args.only]
    keep = args.out.resolve() if args.out is not None else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    # each search is its own process: threads only wait for them; rows in the set's order
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        rows = list(
            pool.map(lambda m: measure(args.tree, m, args.budget, args.seed, keep), mutants)
        )
    print("| mutant | the bug | verdict | wall | search | whose (replayed without the mutant) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mutant, row in zip(mutants, rows, strict=True):
        print(
            f"| {mutant.name} | {mutant.summary} | {row.verdict} | {row.seconds:.0f} s "
            f"| {row.shape} | {row.whose} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
