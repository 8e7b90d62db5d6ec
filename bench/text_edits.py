"""Anchored text edits of an upstream tree's copy: a historical bug put back, or an earlier fix
applied (`upstream_mutants`, `minisgl_history`). Each edit's anchor must occur exactly once, so
an edit that no longer fits the tree stops the run instead of testing something else."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# (file relative to the tree's root, the text there, what replaces it)
Edit = tuple[str, str, str]


def apply_edits(root: Path, edits: Iterable[Edit], who: str) -> Path:
    """`edits` applied in `root`; `who` names the run in the one-line error. Returns `root`."""
    for name, old, new in edits:
        path = root / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{who}: the anchor in {name} is not found exactly once")
        path.write_text(text.replace(old, new))
    return root
