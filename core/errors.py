"""Errors: bad input (`UserError`, one line and exit status 2) and a failed integrity check of a
scheduler's own state (`InvariantError`)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a CLI argument, a scenario or counterexample file, a missing dependency."""


class InvariantError(RuntimeError):
    """An integrity check of the scheduler's own state failed; `invariant` names the broken one."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message
