"""Running the command line in a subprocess against an upstream tree named by its environment
variable (one engine per process), for the adapter tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(
    env_var: str, tree: Path | str, args: list[str], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, env_var: str(tree)}
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
