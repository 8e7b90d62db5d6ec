"""What a search ran of the scheduler's code: `explore --coverage`.

A clean search of real code is worth what it reached. With `--coverage`, each search stream
runs under coverage.py, measuring only the scheduler's code as a counterexample fingerprints it
(`harness/fingerprint.py`: the upstream engine an adapter drives, a user's scheduler file, the
reference's package), found by building the scheduler once before the search. At the end the
streams' data are combined and the driver prints the share of those files' lines that ran and,
for the files it ran most, the lines that never did; coverage.py's JSON and HTML reports go
beside the search's counterexamples.
"""

from __future__ import annotations

import ast
import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlapcheck.core.errors import UserError
from overlapcheck.explore.search import SearchSpec
from overlapcheck.harness.runner import RunResult

SHOWN = 5  # files named in the summary
DATA_FILE = ".coverage-search"  # in the search's own temporary folder (one file per stream)


def _coverage_module() -> Any:
    try:
        import coverage
    except ImportError:
        raise UserError(
            "--coverage needs coverage.py: pip install 'overlapcheck[coverage]'"
        ) from None
    return coverage


def scheduler_files(spec: SearchSpec, built: RunResult) -> tuple[tuple[str, str], ...]:
    """The scheduler's code files, each with the folder it is named relative to (its code
    root), after `built` built it once (`explore.search.basic_run`: an adapter loads its engine
    then). Raises UserError first without coverage.py, before any search stream starts."""
    _coverage_module()
    code = spec.scheduler.fingerprint(built.scheduler)
    return tuple(
        (str(Path(root.path, name)), root.path)
        for root in code.roots
        for name in sorted(root.files)
        if name.endswith(".py")
    )


@contextlib.contextmanager
def measured(files: tuple[str, ...], data_file: str | None) -> Iterator[None]:
    """Run the block under coverage.py, measuring `files` only, its data saved to a file of
    its own beside `data_file` (nothing when `data_file` is None)."""
    if data_file is None:
        yield
        return
    cov = _coverage_module().Coverage(
        data_file=data_file, data_suffix=True, include=list(files), config_file=False
    )
    cov.start()
    try:
        yield
    finally:
        cov.stop()
        cov.save()


@dataclass(frozen=True, slots=True)
class FileCoverage:
    name: str  # relative to its code root
    statements: int
    missing: int
    missing_text: str  # the lines never run, as ranges

    @property
    def ran(self) -> int:
        return self.statements - self.missing


@dataclass(frozen=True, slots=True)
class SearchCoverage:
    files: tuple[FileCoverage, ...]
    unwritten: str | None = None  # why coverage.py's own reports are missing

    @property
    def statements(self) -> int:
        return sum(f.statements for f in self.files)

    @property
    def ran(self) -> int:
        return sum(f.ran for f in self.files)

    def lines(self) -> list[str]:
        """The summary a person reads after the search."""
        if not self.statements:
            return ["coverage: no line of the scheduler's code was measured"]
        out = [
            f"coverage of the scheduler's code over the search: {self.ran:,} of "
            f"{self.statements:,} lines ran ({self.ran / self.statements:.1%}) in "
            f"{len(self.files)} files"
        ]
        # The files the search ran most first: the scheduler's core, where a line never run is
        # a path no example took (an engine's package holds much the search never meant to run:
        # its configuration, other hardware's kernels).
        busiest = sorted((f for f in self.files if f.missing), key=lambda f: (-f.ran, f.name))
        for f in busiest[:SHOWN]:
            out.append(
                f"  {f.name}: {f.ran} of {f.statements} ran; never: {_short(f.missing_text)}"
            )
        if self.unwritten is not None:
            out.append(self.unwritten)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "statements": self.statements,
            "ran": self.ran,
            "files": [
                {"file": f.name, "statements": f.statements, "missing": f.missing_text}
                for f in self.files
            ],
        }


def _function_lines(path: str) -> set[int]:
    """The lines of the file's function bodies (methods and nested functions included)."""
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            lines.update(range(node.body[0].lineno, node.end_lineno + 1))
    return lines


def _ranges(never: list[int], statements: list[int]) -> str:
    """`never` as runs of consecutive statements (`12-15, 20`), as coverage.py writes them."""
    position = {line: i for i, line in enumerate(statements)}
    runs: list[list[int]] = []
    for line in never:
        if runs and position[line] == position[runs[-1][-1]] + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _short(ranges: str, limit: int = 80) -> str:
    return ranges if len(ranges) <= limit else ranges[: ranges.rfind(",", 0, limit)] + ", ..."


def combined(
    data_file: str, files: tuple[tuple[str, str], ...], out: Path | None
) -> SearchCoverage:
    """The streams' data combined: each file's lines that ran. coverage.py's own JSON report and
    HTML pages go to `out` (`coverage.json`, `coverage-html/`) when given."""
    coverage = _coverage_module()
    cov = coverage.Coverage(data_file=data_file, config_file=False)
    with contextlib.suppress(coverage.CoverageException):
        cov.combine([str(Path(data_file).parent)], keep=False)
    cov.load()
    measured_files = set(cov.get_data().measured_files())
    per_file = []
    for path, root in files:
        if path not in measured_files:
            continue
        _, statements, _, missing, _ = cov.analysis2(path)
        # Only what runs when called: a module's own lines ran at its import, before any
        # stream started (the scheduler was built once first), and say nothing of the search.
        inside = _function_lines(path)
        counted = [line for line in statements if line in inside]
        unrun = set(missing)
        never = [line for line in counted if line in unrun]
        name = os.path.relpath(path, root)
        per_file.append(FileCoverage(name, len(counted), len(never), _ranges(never, counted)))
    unwritten = None
    if out is not None and per_file:
        try:
            cov.json_report(outfile=str(out / "coverage.json"))
            cov.html_report(directory=str(out / "coverage-html"))
        except (OSError, coverage.CoverageException) as err:
            unwritten = f"coverage.py's reports were not written to {out}: {err}"
    return SearchCoverage(tuple(per_file), unwritten)


@contextlib.contextmanager
def data_folder() -> Iterator[str]:
    """Where the streams write their data (one file each), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="overlapcheck-coverage-") as folder:
        yield str(Path(folder, DATA_FILE))
