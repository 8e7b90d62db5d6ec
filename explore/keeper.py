"""Keep a found failure on disk while it shrinks: nothing a search finds is lost to Ctrl-C, the
budget, or a killed worker.

The first failure goes to `unshrunk-<invariant>-<hash>.json` at once. Each smaller failure found
while shrinking replaces that file's content (written beside it, then renamed over it: a reader,
or a kill mid-write, sees the old file or the new one, never half of one), so the file always
holds the smallest failure so far, a counterexample that replays like any other. When the search
ends, the result is saved under its own name and the unshrunk file goes, with a line that says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from overlapcheck.formats.counterexample import Counterexample


class FailureKeeper:
    """The search's callbacks for a found failure: `first` (before shrinking) and `smaller`
    (each improvement), then `finish` with what to keep. `notice` prints a line at once."""

    def __init__(self, out: Path, notice: Callable[[str], None]) -> None:
        self.out = out
        self.notice = notice
        self.path: Path | None = None  # the file that holds the smallest failure so far
        self.first_found: Counterexample | None = None
        self.replaced = 0  # smaller failures written over it
        self.found_at: float | None = None  # perf_counter when the first failure arrived
        self.saved_after: float | None = None  # seconds from its arrival to its file

    def first(self, found: Counterexample) -> None:
        self.found_at = time.perf_counter()
        self.first_found = found
        try:
            self.path = found.save(self.out, unshrunk=True)
        except OSError as err:
            self.notice(
                f"found {found.invariant}; cannot save it before shrinking ({err.strerror}); "
                "shrinking"
            )
            return
        self.saved_after = time.perf_counter() - self.found_at
        self.notice(
            f"found {found.invariant} ({found.requests} request(s), {found.iterations} "
            f"iterations); saved before shrinking: {self.path}; shrinking (Ctrl-C keeps the "
            "smallest failure so far)"
        )

    def smaller(self, found: Counterexample) -> None:
        if self.path is None:
            return
        try:
            found.write(self.path)
        except OSError:
            return  # the file keeps the last one written; the search keeps the newest in memory
        self.replaced += 1

    def finish(self, found: Counterexample) -> Path:
        """Save `found` (the shrunk failure, or the smallest so far) under its own name; the
        unshrunk file goes once it is safely written."""
        path = found.save(self.out)
        if self.path is not None and self.path != path and self.path.exists():
            self.path.unlink()
            # said, not done silently: the path printed at the start no longer exists
            self.notice(f"removed {self.path}, saved before shrinking: {path} replaces it")
        return path

    @property
    def kept(self) -> bool:
        """Whether the unshrunk file is still on disk."""
        return self.path is not None and self.path.exists()
