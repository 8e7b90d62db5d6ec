"""One exception hierarchy: every error overlapcheck raises across the command boundary derives
from `OverlapcheckError`, so a caller catches "anything overlapcheck said" in one clause.

- `UserError`: bad input (an argument, a scenario, profile or counterexample file, a missing
  dependency, an upstream tree the adapter cannot use): one line, exit status 2. The specific
  bad-input errors of the layers above (`ConfigError`, `ScenarioError`, `ProfileError`,
  `UnknownFaultError`) derive from it, and from `ValueError` as before.
- `CheckerError`: a bug of overlapcheck's own (the harness's `CheckerBug`): exit status 3, with
  the input that reproduces it saved.

`InvariantError` is not overlapcheck's: a scheduler raises it from its own consistency checks, and
it is a finding about that scheduler. So is a `DeviceFault`: a kernel of the program's that failed
on the simulated device. An exception that passes through overlapcheck's code on its way out of
the program's own call (a torch op that fails by itself on the program's values, inside the
simulated CUDA's dispatch) is marked `program_error`: the crash is the program's.
"""

from __future__ import annotations

from typing import Any

_PROGRAM_ERROR = "_overlapcheck_program_error"


class OverlapcheckError(Exception):
    """Anything overlapcheck itself reports as an error."""


class UserError(OverlapcheckError):
    """Bad input: a CLI argument, a scenario or counterexample file, a missing dependency."""


class CheckerError(OverlapcheckError):
    """A bug of overlapcheck's own, never blamed on the scheduler under test."""


class InvariantError(RuntimeError):
    """An integrity check of the scheduler's own state failed; `invariant` names the broken one."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message


class DeviceFault(InvariantError):
    """A kernel failed on the simulated device with what memory held when it ran, though the
    same kernel succeeds on the values the program wrote in its own order (an index out of range
    read from a copy not yet landed; on a GPU a device-side assert): the program's crash.
    `ops`: the trace's ops that failed (`core.trace.Op`: where they were launched); `details`:
    for `--json`."""

    def __init__(
        self, message: str, ops: tuple[Any, ...] = (), details: dict[str, Any] | None = None
    ) -> None:
        super().__init__("no-crash", message)
        self.ops = ops
        self.details = details or {}


def mark_program_error(error: BaseException) -> None:
    """Say that `error`, raised inside overlapcheck's code, is the program's own (its call
    fails by itself): the crash is a finding, not a bug of overlapcheck's."""
    setattr(error, _PROGRAM_ERROR, True)


def program_error(error: BaseException) -> bool:
    return bool(getattr(error, _PROGRAM_ERROR, False))
