"""Where in the scheduler's own code a device call was made, and how findings name that place.

Every traced operation carries its `Site`: the innermost frame of the scheduler's code (not
overlapcheck's machinery, not torch, not the standard library) at the call. Capturing it is a
few attribute reads per frame and one cached lookup per file, so it
runs for every operation (a code object and an instruction offset); turning it into a
`Location` (its line, a path relative to the scheduler's root) happens only when a finding is
reported. Whose a file is, `core/owners.py` decides.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any

from overlapcheck.core.owners import PACKAGE, runs_the_scheduler

# A frame, without holding the frame: its code and the offset of the instruction it was at
# (the line is worked out only when a finding is reported: `f_lineno` decodes the line table).
Site = tuple[CodeType, int]

# What marks the root of a source tree: its files are named relative to it.
_ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
_HARNESS = PACKAGE / "harness"

_SKIP, _FOUND, _STOP = 0, 1, 2


@cache
def _kind(filename: str) -> int:
    """Whether a frame of `filename` is the scheduler's (`_FOUND`), the harness that steps it
    (`_STOP`: whatever is further out did not make the call), or anything else (`_SKIP`)."""
    if filename.startswith("<"):
        return _SKIP
    path = Path(filename).resolve()
    if path.is_relative_to(_HARNESS):
        return _STOP
    return _FOUND if runs_the_scheduler(path) else _SKIP


def caller(depth: int = 2) -> Site | None:
    """The innermost frame of the scheduler's code above the caller's caller (`depth` frames up
    from here), or None when the scheduler did not make the call (the harness's own calls, an
    adapter's between the scheduler's)."""
    return site_of(sys._getframe(depth))


def site_of(frame: Any) -> Site | None:
    """`caller` from `frame` outwards: the innermost frame of the scheduler's code there."""
    while frame is not None:
        code = frame.f_code
        kind = _kind(code.co_filename)
        if kind == _FOUND:
            return (code, frame.f_lasti)
        if kind == _STOP:
            return None
        frame = frame.f_back
    return None


def raised_at(tb: TracebackType | None) -> Site | None:
    """The innermost frame of the scheduler's code on an exception's traceback: the call that
    broke a contract, the line that raised."""
    found = None
    while tb is not None:
        if _kind(tb.tb_frame.f_code.co_filename) == _FOUND:
            found = (tb.tb_frame.f_code, tb.tb_lasti)
        tb = tb.tb_next
    return found


def line_of(site: Site) -> int:
    """The line a site's instruction belongs to."""
    code, offset = site
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


@cache
def source_root(filename: str) -> str:
    """The folder `filename` is named relative to: the nearest folder above it holding a `.git`,
    a `pyproject.toml` or a setup file (a checkout's root), or the site-packages folder it is
    installed in; else its own folder."""
    path = Path(filename).resolve()
    for folder in path.parents:
        if folder.name in ("site-packages", "dist-packages"):
            return str(folder)
        if any((folder / marker).exists() for marker in _ROOT_MARKERS):
            return str(folder)
    return str(path.parent)


@cache
def _named(filename: str) -> tuple[str, str]:
    """`filename` relative to its source root, and that root (a finding may be reported at
    every iteration of a run: the file system is asked once per file)."""
    root = source_root(filename)
    path = Path(filename).resolve()
    try:
        return path.relative_to(root).as_posix(), root
    except ValueError:
        return path.as_posix(), root


@dataclass(frozen=True, slots=True)
class Location:
    """One place a finding points at: what happened there (`role`: "write", "read", "freed",
    "reused", "crash", ...), in which file (relative to `root`), line and function, by which
    agent (host or a stream) at which scheduler iteration. Findings keep these structured and
    render their prose from them (`text`)."""

    role: str
    file: str
    line: int
    function: str
    root: str
    agent: str = ""
    step: int | None = None
    what: str = ""  # the operation, in the trace's words (`h2d page_table`, `index_put_`)

    @classmethod
    def of(
        cls, role: str, site: Site, agent: str = "", step: int | None = None, what: str = ""
    ) -> Location:
        code = site[0]
        return cls.at(role, code.co_filename, line_of(site), code.co_name, agent, step, what)

    @classmethod
    def at(
        cls,
        role: str,
        filename: str,
        line: int,
        function: str,
        agent: str = "",
        step: int | None = None,
        what: str = "",
    ) -> Location:
        """A location in `filename` (absolute), named relative to its root (`source_root`)."""
        file, root = _named(filename)
        return cls(role, file, line, function, root, agent, step, what)

    def text(self) -> str:
        """`file:line in function`, the way a person reads it."""
        return f"{self.file}:{self.line} in {self.function}"

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "root": self.root,
            "agent": self.agent,
            "step": self.step,
            "what": self.what,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Location:
        return cls(
            str(data["role"]),
            str(data["file"]),
            int(data["line"]),
            str(data.get("function", "")),
            str(data.get("root", "")),
            str(data.get("agent", "")),
            None if data.get("step") is None else int(data["step"]),
            str(data.get("what", "")),
        )
