"""Another revision of this checkout, as a temporary git worktree, for the benchmarks that compare
two revisions (`same_verdicts`, `cost_ab`). Run from it with `PYTHONPATH=<tree>/.typing`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def add_rev_argument(parser: argparse.ArgumentParser) -> None:
    """`--rev`: what `revision_tree` takes, for the benchmarks that compare two revisions."""
    parser.add_argument(
        "--rev", default="HEAD~1", help="the revision to compare with, or a folder of its files"
    )


@contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """A detached worktree of `rev`, removed afterwards. SystemExit with git's line if `rev` is
    not a revision of this checkout. A folder holding another tree's files (its `.typing`, as
    `git archive` leaves it) is used as it is: a machine without the repository, such as the GPU
    guest, gets the other revision that way."""
    folder = Path(rev)
    if (folder / ".typing" / "overlapcheck").is_dir():
        yield folder.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="overlapcheck-rev-") as tmp:
        tree = Path(tmp) / "rev"
        made = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            lines = made.stderr.strip().splitlines() or [f"git worktree add failed for {rev!r}"]
            raise SystemExit(f"error: {lines[-1]}")
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True
            )


def run_from(tree: Path, code: str, *args: str, wrapper: Sequence[str] = (), **env: str) -> str:
    """The stdout of `python -c code args...` run from `tree`'s code (its `.typing`), with `env`
    added to the environment, under `wrapper` (a command that runs the rest: valgrind, say).
    SystemExit with the last line of its stderr if it fails."""
    out = subprocess.run(
        [*wrapper, sys.executable, "-c", code, *args],
        env=os.environ | {"PYTHONPATH": _path_first(tree / ".typing")} | env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout


def _path_first(folder: Path) -> str:
    """PYTHONPATH with `folder` first: the other tree's code, and what the caller's path holds
    besides (a machine whose dependencies lie in a folder of their own, as on the GPU guest)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(folder), *rest])
