"""Errors the scheduler's own integrity checks raise."""

from __future__ import annotations


class InvariantError(RuntimeError):
    """An integrity check of the scheduler's own state failed; `invariant` names the broken one."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.detail = message
