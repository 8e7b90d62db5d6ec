"""What a search stream tells the driver, in order: progress after every round, the first failing
example before shrinking (`Unshrunk`), each smaller one while shrinking, then `Done`; or, instead
of `Done`, `Failed` (one line) or `Crashed` (overlapcheck itself raised). NamedTuples, so that a
process queue and a Ray queue carry them as they are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from overlapcheck.core.scenario import Scenario
from overlapcheck.formats.counterexample import Counterexample


class Progress(NamedTuple):
    stream: int  # which search stream sent it
    examples: int
    iterations: int


class Unshrunk(NamedTuple):
    stream: int
    cex: Counterexample  # the failure found, as its file will hold it


class Smaller(NamedTuple):
    stream: int
    cex: Counterexample


class Done(NamedTuple):
    stream: int
    examples: int
    iterations: int
    cex: Counterexample | None  # the shrunk counterexample, or None
    cut: str | None  # what cut the shrink short (the budget, an interrupt), or None


class Failed(NamedTuple):
    stream: int
    line: str


class Crashed(NamedTuple):
    stream: int
    scenario: Scenario  # the input that makes overlapcheck crash
    line: str
    traceback: str
    extra: dict[str, Any]


StreamMessage = Progress | Unshrunk | Smaller | Done | Failed | Crashed
