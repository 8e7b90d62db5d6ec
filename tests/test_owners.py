"""Whose a source file is (`core/owners.py`): the one decision behind which frame owns a crash,
which frame made a device call, and which modules a replay compares as the scheduler's code."""

from __future__ import annotations

import heapq
from pathlib import Path

import hypothesis
import pytest

from overlapcheck.core import owners
from overlapcheck.core.owners import PACKAGE, owner, runs_the_scheduler

LIBRARY = Path(hypothesis.__file__).resolve()  # in site-packages


def test_the_standard_library_and_site_packages_are_libraries() -> None:
    assert owner(Path(heapq.__file__).resolve()) == "library"
    assert owner(LIBRARY) == "library"
    assert owner(Path("/nowhere/<frozen importlib._bootstrap>")) == "library"


def test_overlapcheck_is_the_checker_except_the_schedulers_it_ships() -> None:
    assert owner(PACKAGE / "harness" / "runner.py") == "checker"
    assert owner(PACKAGE / "core" / "owners.py") == "checker"
    assert owner(PACKAGE / "reference" / "scheduler.py") == "shipped"
    assert owner(PACKAGE / "examples" / "minimal_scheduler.py") == "shipped"
    assert runs_the_scheduler(PACKAGE / "reference" / "scheduler.py")
    assert not runs_the_scheduler(PACKAGE / "harness" / "runner.py")


def test_any_other_file_is_the_schedulers_and_so_is_a_library_under_its_code_root(
    tmp_path: Path,
) -> None:
    assert owner(tmp_path / "engine" / "scheduler.py") == "scheduler"
    assert runs_the_scheduler(tmp_path / "engine" / "scheduler.py")
    # An engine installed in site-packages is the scheduler's when it names that folder its code.
    assert owner(LIBRARY, (LIBRARY.parent,)) == "scheduler"
    assert owner(LIBRARY, (tmp_path,)) == "library"


def test_a_library_folder_inside_the_checkout_is_a_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    venv = PACKAGE / ".venv" / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(owners, "LIBRARY_FOLDERS", (*owners.LIBRARY_FOLDERS, venv))
    decide = owner.__wrapped__  # (not the cache: the folders changed)
    assert decide(venv / "numpy" / "core.py") == "library"
    assert decide(PACKAGE / "harness" / "runner.py") == "checker"


def test_an_engine_tree_kept_inside_the_checkout_is_the_schedulers() -> None:
    """In a checkout the package is the repository's root: an upstream tree unpacked there (a
    hidden folder, say) is the user's code, so its findings name its lines."""
    decide = owner.__wrapped__
    engine = PACKAGE / ".upstream" / "mini-sglang" / "python" / "minisgl" / "scheduler.py"
    assert decide(engine) == "scheduler"
    assert decide(PACKAGE / "notes" / "engine.py") == "scheduler"
    assert decide(PACKAGE / "tests" / "test_owners.py") == "checker"
    assert decide(PACKAGE / "__main__.py") == "checker"
