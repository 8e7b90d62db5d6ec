"""Bugs of SGLang's upstream history put back into 0.5.23 (`sglang_trees.BUGS`): `explore` on the
simulated CUDA finds each one, as docs/sglang.md ("Upstream history") records, its counterexample
replays clean on the tree without the bug, and the same search finds nothing on that tree. Each
search is a subprocess of its own (a process imports one SGLang tree): all `slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang_snapshot import skip_unless_usable
from sglang_trees import BUGS, unpack
from upstream_cli import run_cli

SPEC = "overlapcheck.adapters.sglang:make_scheduler"
skip_unless_usable()

from overlapcheck.adapters.sglang.upstream import ENV  # noqa: E402

pytestmark = pytest.mark.slow

# (bug, loop): the invariant its search reports and the examples it takes at seed 0 (measured;
# the bound leaves room), as docs/sglang.md's table says
FOUND = {
    ("war-barrier", "overlap"): ("no-race", 5),
    ("finished-overlap", "overlap"): ("no-crash", 5),
    ("chunk-count", "overlap"): ("oracle", 5),
    ("chunk-count", "normal"): ("oracle", 5),
    ("radix-repoint", "normal"): ("no-crash", 38),
    # sgl-project/sglang#1860: reached since pages on demand map onto SGLang's own estimate and
    # a workload under concurrent pressure may stop at a model EOS (docs/sglang.md)
    ("retract-overlap", "overlap"): ("no-crash", 11),
}


def _explore(tree: Path, loop: str, examples: int, out: Path) -> tuple[int, list[Path]]:
    done = run_cli(
        ENV,
        tree,
        ["explore", "--scheduler", SPEC, "--loop", loop, "--skip", "exact-length",
         "--workers", "1", "--seed", "0", "--max-examples", str(examples), "--budget", "900",
         "--out", str(out), "--db", "none", "--no-timeline"],
        out.parent,
        timeout=1200,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode, sorted(out.glob("*.json"))


@pytest.mark.parametrize(("bug", "loop"), sorted(FOUND))
def test_the_search_finds_the_bug_and_its_counterexample_replays_clean_without_it(
    bug: str, loop: str, tmp_path: Path
) -> None:
    invariant, examples = FOUND[bug, loop]
    tree = unpack(tmp_path / "bug", BUGS[bug].edits)
    rc, found = _explore(tree, loop, examples + 10, tmp_path / "found")
    assert rc == 1 and len(found) == 1, found
    assert json.loads(found[0].read_text())["invariant"] == invariant
    clean = unpack(tmp_path / "clean")
    replayed = run_cli(ENV, clean, ["replay", str(found[0])], tmp_path)
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_the_same_search_finds_nothing_on_the_tree_without_them(loop: str, tmp_path: Path) -> None:
    examples = max(n for _, n in FOUND.values()) + 10
    rc, found = _explore(unpack(tmp_path / "clean"), loop, examples, tmp_path / "found")
    assert rc == 0 and not found, found
