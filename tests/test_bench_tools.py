"""The helpers of the benchmarks that compare two revisions (`bench/worktree.py`) and count
instructions (`bench/instructions.py`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from overlapcheck.bench.instructions import Cost, instructions
from overlapcheck.bench.instructions import main as instructions_main
from overlapcheck.bench.worktree import ROOT, revision_tree, run_from


def test_a_folder_of_another_trees_files_is_used_as_it_is(tmp_path: Path) -> None:
    # What a machine without the repository gets: the other revision's files, as git archive
    # leaves them (the package reached through `.typing`).
    (tmp_path / ".typing").mkdir()
    (tmp_path / ".typing" / "overlapcheck").symlink_to(tmp_path)
    (tmp_path / "__init__.py").write_text("REVISION = 'the other one'\n")
    with revision_tree(str(tmp_path)) as tree:
        assert tree == tmp_path.resolve()
        out = run_from(tree, "import overlapcheck; print(overlapcheck.REVISION)")
    assert out.strip() == "the other one"
    assert tmp_path.exists()  # not removed: it is not ours


def test_a_name_that_is_neither_a_revision_nor_a_tree_is_one_error_line() -> None:
    with pytest.raises(SystemExit) as stopped, revision_tree("no-such-revision-or-folder"):
        pass
    assert str(stopped.value).startswith("error: ")


@pytest.mark.skipif(
    shutil.which("git") is None
    or subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode,
    reason="not a git checkout",
)
def test_a_revision_is_a_worktree_removed_afterwards() -> None:
    with revision_tree("HEAD") as tree:
        assert (tree / ".typing" / "overlapcheck" / "bench" / "worktree.py").is_file()
    assert not tree.exists()


def test_the_other_trees_code_comes_first_and_the_callers_path_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "a_dependency.py").write_text("WHERE = 'deps'\n")
    monkeypatch.setenv("PYTHONPATH", str(deps))
    out = run_from(ROOT, "import a_dependency, overlapcheck; print(a_dependency.WHERE)")
    assert out.strip() == "deps"


def test_the_instruction_count_is_read_from_cachegrinds_summary() -> None:
    log = "==7== Collected : 5977164381\n==7==\n==7== I   refs:      5,977,164,381\n"
    assert instructions(log) == 5_977_164_381
    with pytest.raises(SystemExit) as stopped:
        instructions("==7== valgrind: cannot start\n")
    assert str(stopped.value).startswith("error: ")


def test_counting_instructions_without_valgrind_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["instructions"])
    with pytest.raises(SystemExit) as stopped:
        instructions_main()
    assert str(stopped.value) == "error: valgrind is not installed (it counts the instructions)"


def test_a_cost_is_the_checks_over_footprints_only() -> None:
    assert Cost(footprints=700e6, checks=210e6).ratio == pytest.approx(1.3)
