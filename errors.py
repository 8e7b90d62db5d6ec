"""Errors that reach the user as one line and exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a CLI argument, a scenario or counterexample file, a missing dependency."""
