"""The helpers of the benchmarks that compare two revisions (`bench/worktree.py`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

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
