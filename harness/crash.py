"""Whose exception is it? A crash of the scheduler under test is a finding (`no-crash`); a crash
inside overlapcheck is a bug of ours (`CheckerBug`, exit 3 with the input saved).

The traceback decides: walking from where the exception was raised outwards, the first frame in
code that belongs to somebody (the scheduler's files, or overlapcheck's own: `core/owners.py`)
owns it. Library frames (the standard library, site-packages: numpy raising an IndexError for the
scheduler's bad index) belong to whoever called them, and so do overlapcheck's frames for an
exception marked as the program's own (`core.errors.program_error`: a torch op of the program's
that fails by itself, raised inside the simulated CUDA's dispatch).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from overlapcheck.core.errors import CheckerError, UserError, program_error
from overlapcheck.core.owners import owner, runs_the_scheduler
from overlapcheck.core.sites import Location
from overlapcheck.invariants.base import Violation


class CheckerBug(CheckerError):
    """An exception inside overlapcheck while it ran a scenario: not the scheduler's fault."""

    def __init__(self, error: BaseException, scenario: Any) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.scenario = scenario
        self.extra: dict[str, Any] = {}  # what the caller adds to replay it (timing draws, ...)

    def traceback_text(self) -> str:
        return "".join(traceback.format_exception(self.error))


class RankProcessDied(UserError):
    """A rank's worker process ended in the middle of a run (killed, or out of memory): one
    line, exit 2; not the scheduler's finding (no frames to show), nor a bug of ours."""


class RemoteCrash(Exception):
    """The scheduler's exception in another process (a rank of its own,
    `harness/rank_processes.py`): its type's name, message and frames as that process saw them;
    the whole traceback rides along as a note (what a bug of ours prints)."""

    def __init__(
        self, type_name: str, text: str, frames: traceback.StackSummary, formatted: str
    ) -> None:
        super().__init__(f"{type_name}: {text}" if text else type_name)
        self.type_name = type_name
        self.text = text
        self.frames = frames
        self.add_note(f"in the rank's process:\n{formatted.rstrip()}")


def _frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb))


def crash_violation(error: BaseException, step: int, now: float) -> Violation | None:
    """A `no-crash` violation if the scheduler raised `error`; None if overlapcheck did. A rank's
    exception (a run of several) names the rank."""
    remote = error if isinstance(error, RemoteCrash) else None
    frames = list(remote.frames) if remote is not None else _frames(error.__traceback__)
    name = remote.type_name if remote is not None else type(error).__name__
    text = remote.text if remote is not None else str(error).splitlines()[0] if str(error) else ""
    rank = [note for note in getattr(error, "__notes__", ()) if note.startswith("(on rank ")]
    # (the program's own error on its way out through overlapcheck's code: past our frames)
    passing = program_error(error)
    for frame in reversed(frames):
        whose = owner(Path(frame.filename).resolve())
        if whose == "library" or (whose == "checker" and passing):
            continue
        if whose == "checker":
            return None
        at = Location.at("raised", frame.filename, frame.lineno or 0, frame.name, "host", step)
        return Violation(
            "no-crash",
            step,
            now,
            (),
            f"the scheduler raised {name}: {text} ({at.text()}){''.join(' ' + r for r in rank)}",
            {
                "type": name,
                "exception": text,
                "file": at.file,
                "line": frame.lineno,
                "function": frame.name,
                "traceback": [_named(f) for f in frames[-8:]],
            },
            (at,),
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
        if not runs_the_scheduler(Path(frame.filename).resolve()):
            continue
        at = Location.at("stuck", frame.filename, frame.lineno or 0, frame.name, "host", step)
        where = at.text()
        code = f": `{frame.line}`" if frame.line else ""
        ours = [f for f in frames if runs_the_scheduler(Path(f.filename).resolve())]
        return Violation(
            "no-hang",
            step,
            now,
            (),
            f"step() did not return within {timeout:g} s of wall-clock time; stuck at {where}"
            f"{code}",
            {
                "timeout": timeout,
                "file": at.file,
                "line": frame.lineno,
                "function": frame.name,
                "stack": [_named(f) for f in ours[-8:]],
            },
            (at,),
        )
    return None


def _named(frame: traceback.FrameSummary) -> str:
    """`file:line in function`, the file relative to its tree (`core/sites.py`)."""
    return Location.at("", frame.filename, frame.lineno or 0, frame.name).text()
