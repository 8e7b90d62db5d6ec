"""Whose exception is it? A crash of the scheduler under test is a finding (`no-crash`); a crash
inside overlapcheck is a bug of ours (`CheckerBug`, exit 3 with the input saved).

The traceback decides: walking from where the exception was raised outwards, the first frame in
code that belongs to somebody (the scheduler's files, or overlapcheck's own) owns it. Library
frames (the standard library, site-packages: numpy raising an IndexError for the scheduler's bad
index) belong to whoever called them.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from overlapcheck.core.errors import CheckerError
from overlapcheck.invariants.base import Violation

_PACKAGE = Path(__file__).resolve().parent.parent  # the package root: this file is in harness/
# Folders of overlapcheck that hold schedulers under test, not the checker.
_SCHEDULER_FOLDERS = (_PACKAGE / "reference", _PACKAGE / "examples")
_LIBRARY_FOLDERS = tuple(
    Path(p).resolve()
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)


class CheckerBug(CheckerError):
    """An exception inside overlapcheck while it ran a scenario: not the scheduler's fault."""

    def __init__(self, error: BaseException, scenario: Any) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.scenario = scenario
        self.extra: dict[str, Any] = {}  # what the caller adds to replay it (timing draws, ...)

    def traceback_text(self) -> str:
        return "".join(traceback.format_exception(self.error))


def _owner(path: Path) -> str:
    """`scheduler`, `checker` or `library` for a source file."""
    # The package may live in a library folder (installed from a wheel) and a library folder may
    # live in the package (a virtual environment inside the checkout): only the innermost counts.
    in_library = any(path.is_relative_to(folder) for folder in _LIBRARY_FOLDERS)
    if path.is_relative_to(_PACKAGE) and not any(
        path.is_relative_to(folder) and folder.is_relative_to(_PACKAGE)
        for folder in _LIBRARY_FOLDERS
    ):
        if any(path.is_relative_to(folder) for folder in _SCHEDULER_FOLDERS):
            return "scheduler"
        return "checker"
    if in_library:
        return "library"
    if path.name.startswith("<"):  # <frozen ...>, <string>
        return "library"
    return "scheduler"  # the user's own files


def _frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb))


def crash_violation(error: BaseException, step: int, now: float) -> Violation | None:
    """A `no-crash` violation if the scheduler raised `error`; None if overlapcheck did."""
    frames = _frames(error.__traceback__)
    for frame in reversed(frames):
        owner = _owner(Path(frame.filename).resolve())
        if owner == "library":
            continue
        if owner == "checker":
            return None
        where = f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
        text = str(error).splitlines()[0] if str(error) else ""
        return Violation(
            "no-crash",
            step,
            now,
            (),
            f"the scheduler raised {type(error).__name__}: {text} ({where})",
            {
                "type": type(error).__name__,
                "exception": text,
                "file": _short(frame.filename),
                "line": frame.lineno,
                "function": frame.name,
                "traceback": [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in frames[-8:]],
            },
        )
    return None


def hang_violation(
    stack: traceback.StackSummary, timeout: float, step: int, now: float
) -> Violation | None:
    """A `no-hang` violation naming the innermost frame of the scheduler's own code on `stack`
    (outermost first), where a step() stood when the watchdog stopped it; None if no frame of
    the scheduler's is on it (then overlapcheck itself hung)."""
    frames = list(stack)
    for frame in reversed(frames):
        if _owner(Path(frame.filename).resolve()) != "scheduler":
            continue
        where = f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
        code = f": `{frame.line}`" if frame.line else ""
        ours = [f for f in frames if _owner(Path(f.filename).resolve()) == "scheduler"]
        return Violation(
            "no-hang",
            step,
            now,
            (),
            f"step() did not return within {timeout:g} s of wall-clock time; stuck at {where}"
            f"{code}",
            {
                "timeout": timeout,
                "file": _short(frame.filename),
                "line": frame.lineno,
                "function": frame.name,
                "stack": [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in ours[-8:]],
            },
        )
    return None


def _short(filename: str) -> str:
    path = Path(filename).resolve()
    if path.is_relative_to(_PACKAGE):
        return str(path.relative_to(_PACKAGE.parent))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
