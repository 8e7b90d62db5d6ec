"""`explore --coverage` (`explore/coverage.py`): which lines of the scheduler's code a search
ran, counted in function bodies only (a module's own lines ran at its import, before the search),
from every stream, with coverage.py's own reports beside the counterexamples."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from overlapcheck.core.errors import UserError
from overlapcheck.explore import coverage as search_coverage

ROOT = Path(__file__).resolve().parent.parent
NEVER_CALLED = """

def never_called(n: int) -> int:
    doubled = n * 2
    return doubled + 1
"""


def _explore(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck.cli", "explore", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=cwd,
    )


def _lines(ranges: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, ranges.split(", ")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_users_scheduler_file_is_measured_and_its_unrun_function_named(
    tmp_path: Path, workers: str
) -> None:
    scheduler = tmp_path / "mine.py"
    shutil.copy(ROOT / "examples/minimal_scheduler.py", scheduler)
    text = scheduler.read_text() + NEVER_CALLED
    scheduler.write_text(text)
    body = [i + 1 for i, line in enumerate(text.splitlines()) if "doubled" in line]
    proc = _explore(
        "--scheduler",
        f"{scheduler}:make_scheduler",
        "--coverage",
        "--max-examples",
        "4",
        "--workers",
        workers,
        "--json",
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["coverage"]
    files = {f["file"]: f for f in report["files"]}
    assert list(files) == ["mine.py"], files  # the scheduler's code, not overlapcheck's
    mine = files["mine.py"]
    assert mine["missing"].endswith(f"{body[0]}-{body[1]}")  # the function never called
    assert 0 < report["ran"] < report["statements"] == mine["statements"]
    # the module's own lines (its imports, its class statements) ran at import: not counted
    never = _lines(mine["missing"])
    imports = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("import ")]
    assert imports and not never & set(imports)
    assert "coverage of the scheduler's code over the search" in proc.stderr
    assert (tmp_path / "out/coverage.json").is_file()
    assert (tmp_path / "out/coverage-html/index.html").is_file()


def test_without_coverage_py_it_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "coverage", None)  # an import of it fails
    with (
        pytest.raises(UserError, match=r"pip install 'overlapcheck\[coverage\]'"),
        search_coverage.measured(("x.py",), "data"),
    ):
        pass


def test_ranges_are_runs_of_consecutive_statements() -> None:
    statements = [3, 4, 7, 9, 12, 13]
    assert search_coverage._ranges([3, 4, 7, 12], statements) == "3-7, 12"
    assert search_coverage._ranges([], statements) == ""


def test_the_streams_data_are_combined_and_a_report_that_cannot_be_written_is_told(
    tmp_path: Path,
) -> None:
    module = tmp_path / "measured_module.py"
    module.write_text("def called(n):\n    return n + 1\n" + NEVER_CALLED)
    spec = importlib.util.spec_from_file_location("measured_module", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    data = str(tmp_path / "data/.coverage-search")
    Path(data).parent.mkdir()
    for n in (1, 2):  # two streams, each its own data file
        with search_coverage.measured((str(module),), data):
            loaded.called(n)
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    got = search_coverage.combined(data, ((str(module), str(tmp_path)),), not_a_folder)
    (only,) = got.files
    assert only.name == "measured_module.py" and (only.statements, only.missing) == (3, 2)
    assert got.unwritten is not None and "reports were not written" in got.unwritten
    assert got.lines()[-1] == got.unwritten
