"""One exception hierarchy: every error overlapcheck raises across the command boundary derives
from `OverlapcheckError`, so a caller catches "anything overlapcheck said" in one clause.

- `UserError`: bad input (an argument, a scenario, profile or counterexample file, a missing
  dependency, an upstream tree the adapter cannot use): one line, exit status 2. The specific
  bad-input errors of the layers above (`ConfigError`, `ScenarioError`, `ProfileError`,
  `UnknownFaultError`) derive from it, and from `ValueError` as before.
- `CheckerError`: a bug of overlapcheck's own (the harness's `CheckerBug`): exit status 3, with
  the input that reproduces it saved.

`InvariantError` is not overlapcheck's: a scheduler raises it from its own consistency checks, and
it is a finding about that scheduler.
"""

from __future__ import annotations


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
