"""The git revision of the checked-out code, recorded in the files a run saves."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
