"""The mini-sglang mutants bench (`bench/minisgl_mutants.py`): every mutant's edit fits the fixed
20fcd7f tree exactly once (a drifted anchor would test something else), each mutant's tree still
compiles and imports (a mutant that fails at import tests nothing of the search), and a bad
`--tree`, `--set` or mutant name is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from minisgl_trees import FIXES, SNAPSHOT, unpack

from overlapcheck.bench.minisgl_mutants import BLIND, MUTANTS, SETS
from overlapcheck.bench.text_edits import apply_edits

pytestmark = pytest.mark.skipif(
    not SNAPSHOT.is_file(), reason=f"no mini-sglang snapshot at {SNAPSHOT}"
)

# Run in a child (one mini-sglang per process): each mutant's edits applied in turn, the modules
# they touch imported afresh from the tree, the tree put back. Prints the mutants that failed.
IMPORT_EACH = """
import importlib, json, sys
from pathlib import Path
from overlapcheck.adapters.base import install_stand_ins
from overlapcheck.adapters.minisgl.checkout import MINISGL
from overlapcheck.bench.text_edits import apply_edits
tree, mutants = Path(sys.argv[1]), json.loads(sys.argv[2])
sys.path.insert(0, str(tree / "python"))
install_stand_ins(MINISGL.stand_ins, MINISGL.name)
failed = []
for name, edits in mutants:
    before = {file: (tree / file).read_text() for file, _, _ in edits}
    apply_edits(tree, [tuple(e) for e in edits], name)
    for module in [m for m in sys.modules if m == "minisgl" or m.startswith("minisgl.")]:
        del sys.modules[module]
    try:
        for file in ["python/minisgl/scheduler/scheduler.py", *before]:
            importlib.import_module(file[len("python/"):-len(".py")].replace("/", "."))
    except Exception as err:
        failed.append(f"{name}: {type(err).__name__}: {err}")
    for file, text in before.items():
        (tree / file).write_text(text)
print(json.dumps(failed))
"""


@pytest.mark.parametrize("which", sorted(SETS))
def test_each_mutant_changes_the_fixed_tree_where_it_says(tmp_path: Path, which: str) -> None:
    tree = unpack(tmp_path, FIXES)
    mutants = SETS[which]
    for mutant in mutants:
        before = {name: (tree / name).read_text() for name, _, _ in mutant.edits}
        apply_edits(tree, mutant.edits, mutant.name)  # (exits when an anchor is not there once)
        for name, text in before.items():
            after = (tree / name).read_text()
            assert after != text, mutant.name
            compile(after, name, "exec")
            (tree / name).write_text(text)  # back to the fixed tree for the next one
    assert mutants[0].name == "control" and not mutants[0].edits
    assert len({m.name for m in mutants}) == len(mutants)


def test_the_blind_set_is_new_and_spread_over_the_code() -> None:
    assert len(BLIND) - 1 >= 12
    assert not {m.name for m in BLIND[1:]} & {m.name for m in MUTANTS}
    files = {name for m in BLIND for name, _, _ in m.edits}
    assert len(files) >= 6  # beyond the scheduler: managers, radix cache, core, graph runner


def test_each_mutant_tree_imports(tmp_path: Path) -> None:
    tree = unpack(tmp_path, FIXES)
    mutants = [(m.name, m.edits) for m in (*MUTANTS[1:], *BLIND[1:])]
    # (and one that breaks the import: the check can fail)
    broken = ("broken", (("python/minisgl/scheduler/table.py", "import torch\n", "\n"),))
    done = subprocess.run(
        [sys.executable, "-B", "-c", IMPORT_EACH, str(tree), json.dumps([*mutants, broken])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.splitlines()[-1])
    assert failed == ["broken: NameError: name 'torch' is not defined"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tree", "/nonexistent"], "is not a mini-sglang tree"),
        (["--tree", str(Path(__file__).parent), "--only", "x"], "is not a mini-sglang tree"),
        (["--tree", "/nonexistent", "--set", "x"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "overlapcheck.bench.minisgl_mutants", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and says in done.stderr
    assert len(done.stderr.splitlines()) == 1 or "usage:" in done.stderr


def test_a_finding_of_the_trees_own_bug_is_searched_past(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mutant's search that stops at the tree's own bug (its counterexample reproduces without
    the mutant) is run again with that invariant skipped, on the next seed, until it finds the
    mutant's; the row is the last search's."""
    from overlapcheck.bench import minisgl_mutants

    calls: list[list[str]] = []

    def fake(args: list[str], checkout: Path, cwd: Path) -> str:
        calls.append(args)
        if args[0] == "replay":  # the first two searches' files are the tree's, the third's not
            return "fixed: x no longer fires" if "/past2/" in args[1] else "reproduced: x"
        out = cwd / args[args.index("--out") + 1]
        out.mkdir()
        invariant = ("pages-conserved", "oracle", "no-crash")[args.count("--skip")]
        (out / f"{invariant}-1.json").write_text("{}")
        return f"VIOLATION [{invariant}] step 1: something\n"

    monkeypatch.setattr(minisgl_mutants, "overlapcheck", fake)
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a/f.py").write_text("x = 1\n")
    mutant = minisgl_mutants.Mutant("m", "x becomes 2", (("a/f.py", "x = 1", "x = 2"),))
    row = minisgl_mutants.measure(tree, mutant, 5, 0, tmp_path / "keep")
    said = "(past the tree's pages-conserved, oracle) VIOLATION [no-crash] step 1: something"
    assert row.verdict == said and row.whose == "the mutant's"
    third = calls[4]
    assert third[-4:] == ["--skip", "pages-conserved", "--skip", "oracle"]
    assert third[third.index("--seed") + 1] == "2"  # (the examples already run are not again)
    assert (tmp_path / "keep/m/past2/no-crash-1.json").is_file()
    assert (tree / "a/f.py").read_text() == "x = 1\n"  # the tree itself is never edited
