"""The mini-sglang mutants bench (`bench/minisgl_mutants.py`): every mutant's edit fits the fixed
20fcd7f tree exactly once (a drifted anchor would test something else), and a bad `--tree` or
mutant name is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from minisgl_trees import FIXES, SNAPSHOT, unpack

from overlapcheck.bench.minisgl_mutants import MUTANTS
from overlapcheck.bench.text_edits import apply_edits

pytestmark = pytest.mark.skipif(
    not SNAPSHOT.is_file(), reason=f"no mini-sglang snapshot at {SNAPSHOT}"
)


def test_each_mutant_changes_the_fixed_tree_where_it_says(tmp_path: Path) -> None:
    tree = unpack(tmp_path, FIXES)
    for mutant in MUTANTS:
        before = {name: (tree / name).read_text() for name, _, _ in mutant.edits}
        apply_edits(tree, mutant.edits, mutant.name)
        for name, text in before.items():
            assert (tree / name).read_text() != text, mutant.name
            (tree / name).write_text(text)  # back to the fixed tree for the next one
    assert MUTANTS[0].name == "control" and not MUTANTS[0].edits


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tree", "/nonexistent"], "is not a mini-sglang tree"),
        (["--tree", str(Path(__file__).parent), "--only", "x"], "is not a mini-sglang tree"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "overlapcheck.bench.minisgl_mutants", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.splitlines()) == 1
