"""Which overlapcheck wrote a file: the git revision of its checkout, and a digest of its own
code, which a replay compares to tell a change of overlapcheck's from one of the scheduler's."""

from __future__ import annotations

import hashlib
import subprocess
from functools import cache
from pathlib import Path

from overlapcheck.core.owners import PACKAGE

# Folders of the package that never shape a run's trace or verdict.
_NOT_RUN = frozenset({"tests", "bench", "docs", "build"})


def git_revision() -> str:
    """`git rev-parse HEAD` in the package's folder, or "unknown" outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@cache
def checker_digest() -> str:
    """A digest of overlapcheck's own Python files (its subpackages, as installed or checked
    out): equal in two processes exactly when they run the same overlapcheck code, in a wheel
    as in a checkout (where `git_revision` misses uncommitted edits)."""
    digest = hashlib.blake2b(digest_size=8)
    for path in _own_files():
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _own_files() -> list[Path]:
    files = sorted(PACKAGE.glob("*.py"))
    for folder in sorted(PACKAGE.iterdir()):
        if folder.name in _NOT_RUN or not (folder / "__init__.py").is_file():
            continue
        files.extend(sorted(folder.rglob("*.py")))
    return files
