"""Bugs from mini-sglang's history, found again: for each upstream commit that fixed a bug in
the code the adapter runs, a search of the commit before it (`explore`, one worker), then the
counterexample it saved replayed on the fix (`replay`, which must say `fixed`).

    python -m overlapcheck.bench.minisgl_history --repo /path/to/mini-sglang   # a git clone
    python -m overlapcheck.bench.minisgl_history --repo ... --only ef4367f --budget 120

Each fix names the invariants of the other bugs its parent commit also has (`skip`: a search
finds those first, and a user who knows them passes them to `--skip` as well), and the patches
of earlier bugs that would hide it (`edits`, applied to both trees: the radix cache's dirty
values, fixed in 94fe255, lose pages in every tree before it). The trees are `git archive`d
into a temporary folder; the repository is not touched.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.bench.text_edits import Edit, apply_edits

SPEC = "overlapcheck.adapters.minisgl:make_scheduler"
# mini-sglang's known bugs of its overlap loop, present from December 2025 to 20fcd7f
# (docs/minisgl.md, bugs 6, 1, 2, 3): a search of any commit then finds them first.
KNOWN = ("no-race", "exact-length", "no-post-eos", "slot-not-in-flight")
RADIX = "python/minisgl/kvcache/radix_manager.py"
# 94fe255: the radix tree kept a view of the page table's row, not a copy of it
DIRTY_RADIX_FIX = (
    RADIX,
    "new_node.set_key_value(input_ids[prefix_len:], indices[prefix_len:])",
    "new_node.set_key_value(input_ids[prefix_len:], indices[prefix_len:].clone())",
)

# 8827b0f: `lock_handle` moved to the parent before counting a node, so the matched node itself
# was never locked (nor unlocked); anchored around the unlock's assertion, which 5e1318b changed
_UP = "                node = node.parent\n"
_UNLOCKED = "                    self.protected_size -= node.length\n"
_LOCK = """                if node.ref_count == 0:
                    self.evictable_size -= node.length
                    self.protected_size += node.length
                node.ref_count += 1
"""
_COUNT_DOWN = "                node.ref_count -= 1\n"
LOCK_FIX = (
    (RADIX, _UP + _COUNT_DOWN, _COUNT_DOWN),
    (RADIX, _UNLOCKED, _UNLOCKED + _UP),
    (RADIX, _UP + _LOCK, _LOCK + _UP),
)
# 61acfdc: the handle `match_prefix` returned named the root, not the matched node
_MATCHED = "        return RadixCacheHandle(prefix_len, node), torch.cat(value_list)"
MATCHED_FIX = (
    (
        RADIX,
        "        value_list: List[torch.Tensor] = []\n",
        "        value_list: List[torch.Tensor] = []\n        matched_node = node\n",
    ),
    (RADIX, _MATCHED, _MATCHED.replace("prefix_len, node)", "prefix_len, matched_node)")),
)


@dataclass(frozen=True)
class Fix:
    """One upstream commit that fixed a bug, and how its parent is searched."""

    commit: str
    title: str
    skip: tuple[str, ...] = KNOWN
    edits: tuple[Edit, ...] = ()  # in both trees


HISTORY = (
    Fix("dae78f6", "Fix cache evict when page_size > 1 (#80)", (*KNOWN, "abort-silent")),
    Fix("ef4367f", "fix race condition in chunked prefill", KNOWN[:3]),
    Fix("94fe255", "fix potential dirty value of radix cache", (*KNOWN, "work-bound")),
    Fix(
        "0e5f1e7",
        "fix wrong token_pool initialization",
        (*KNOWN, "work-bound"),
        (DIRTY_RADIX_FIX,),
    ),
    Fix(
        "8827b0f",
        "Missing lock/unlock of current node in RadixCacheManager when using lock_handle",
        (*KNOWN, "work-bound", "no-uninit-read"),
        (DIRTY_RADIX_FIX,),
    ),
    Fix(
        "61acfdc",
        "Preserve matched_node in match_prefix before parent traversal (#46)",
        (*KNOWN, "work-bound", "no-uninit-read"),
        (DIRTY_RADIX_FIX, *LOCK_FIX),
    ),
    Fix(
        "5e1318b",
        "Fix wrong ref_count assertion in RadixCacheManager (#44)",
        (*KNOWN, "work-bound", "no-uninit-read"),
        (DIRTY_RADIX_FIX, *LOCK_FIX, *MATCHED_FIX),
    ),
)

SEARCH_FOUND = re.compile(
    r"found after (\d+) examples, (\d+) scheduler iterations simulated, ([\d.]+) s; "
    r"shrunk to (\d+) request\(s\), (\d+) iterations"
)


@dataclass
class Outcome:
    fix: Fix
    found: str  # the violation line, or what the search said instead
    seconds: float
    shape: str  # examples, iterations, shrunk size
    replay: str  # the first line of the replay on the fix


def tree(repo: Path, commit: str, into: Path, edits: tuple[Edit, ...]) -> Path:
    """`commit` of `repo` unpacked into `into`, with `edits` applied."""
    data = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return apply_edits(into, edits, commit)


def overlapcheck(args: list[str], checkout: Path, cwd: Path) -> str:
    env = {**os.environ, "MINISGL_PATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-m", "overlapcheck", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout + done.stderr


def measure(repo: Path, fix: Fix, budget: int, seed: int) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"overlapcheck-history-{fix.commit}-") as tmp:
        work = Path(tmp)
        before = tree(repo, f"{fix.commit}~1", work / "before", fix.edits)
        after = tree(repo, fix.commit, work / "after", fix.edits)
        skips = [a for s in fix.skip for a in ("--skip", s)]
        search = ["explore", "--scheduler", SPEC, "--budget", str(budget), "--workers", "1"]
        started = time.monotonic()
        said = overlapcheck([*search, "--seed", str(seed), "--out", "out", *skips], before, work)
        seconds = time.monotonic() - started
        violation = next((ln for ln in said.splitlines() if ln.startswith("VIOLATION")), "")
        shape = SEARCH_FOUND.search(said)
        files = sorted(p for p in (work / "out").glob("*.json") if "unshrunk" not in p.name)
        if not violation or not files:
            last = said.strip().splitlines()[-1] if said.strip() else "nothing printed"
            return Outcome(fix, f"not found: {last}", seconds, "", "")
        replay = overlapcheck(["replay", str(files[0])], after, work).strip().splitlines()
        described = (
            f"found in {shape[3]} s, {shape[1]} examples, {shape[2]} iterations; shrunk to "
            f"{shape[4]} request(s), {shape[5]} iterations"
            if shape
            else ""
        )
        return Outcome(fix, violation, seconds, described, replay[0] if replay else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a git clone (or mirror)")
    parser.add_argument("--budget", type=int, default=300, help="search seconds per fix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="these fixes' commits only")
    args = parser.parse_args()
    probe = ["git", "-C", str(args.repo), "cat-file", "-e", f"{HISTORY[0].commit}^{{commit}}"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        print(f"minisgl_history: {args.repo} is not a git clone of mini-sglang", file=sys.stderr)
        return 2
    chosen = [f for f in HISTORY if not args.only or f.commit in args.only]
    print("| fix | bug | found on its parent | wall (import, shrink) | search | on the fix |")
    print("| --- | --- | --- | --- | --- | --- |")
    for fix in chosen:
        o = measure(args.repo, fix, args.budget, args.seed)
        found = o.found.removeprefix("VIOLATION ")
        print(
            f"| {fix.commit} | {fix.title} | {found} | {o.seconds:.0f} s | {o.shape} | "
            f"{o.replay.split('(')[0].strip()} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
