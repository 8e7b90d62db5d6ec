"""Another revision of this checkout, as a temporary git worktree, for the benchmarks that compare
two revisions (`same_verdicts`, `cost_ab`). Run from it with `PYTHONPATH=<tree>/.typing`."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """A detached worktree of `rev`, removed afterwards. SystemExit with git's line if `rev` is
    not a revision of this checkout."""
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
