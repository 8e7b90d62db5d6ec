"""The SGLang 0.5.23 snapshot for the tests (`../shared/upstream/sglang-0.5.23-src.tar.gz`, or
`SGLANG_SNAPSHOT`): unpacked once per test process (a process imports one SGLang), and the
one-line skips when it or SGLang's dependencies are absent."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(
    os.environ.get("SGLANG_SNAPSHOT", ROOT.parent / "shared/upstream/sglang-0.5.23-src.tar.gz")
)


def skip_unless_usable() -> None:
    """Skip the calling test module (one line) without the snapshot or the `sglang` extra."""
    pytest.importorskip("torch")
    if not SNAPSHOT.is_file():
        pytest.skip(f"no SGLang snapshot at {SNAPSHOT}", allow_module_level=True)
    from overlapcheck.adapters.sglang.upstream import missing_dependencies

    missing = missing_dependencies()
    if missing:
        pytest.skip(
            f"SGLang's dependencies are not installed: {missing} (pip install -e '.[sglang]')",
            allow_module_level=True,
        )


def unpack(into: Path) -> Path:
    """The snapshot unpacked into `into`; returns the folder holding the `sglang` package."""
    with tarfile.open(SNAPSHOT) as tar:
        tar.extractall(into, filter="data")
    (root,) = into.iterdir()
    return root


@functools.cache
def shared_tree() -> Path:
    """This process's unpacked snapshot, removed when the process exits."""
    folder = tempfile.mkdtemp(prefix="overlapcheck-sglang-")
    atexit.register(shutil.rmtree, folder, True)
    return unpack(Path(folder))
