"""Ranks that must agree: what a scheduler under tensor or data parallelism offers the harness.

Under tensor parallelism every rank runs its own copy of the scheduler on the same messages, and
all of them must launch the same batches in the same order, or their collectives pair different
work (wrong outputs or a hang). Under data-parallel attention the ranks' batches differ, but they
must agree on the collective decisions (whether to run a batch, in which mode, whether to overlap
it). With `num_ranks > 1` (`--ranks N`) the harness builds the scheduler once per rank, each with
its own objects and its own `SchedulerConfig.rank`, feeds every rank the same messages in the same
iterations, and the check `rank-consistent` compares, iteration by iteration, what each rank
launched (`Trace.launches`: each forward's requests in order, phase and new positions) and the
decisions it declares (`HasDecisions`). Slots, pages and everything else a rank keeps for itself
are rank-local: never compared.

Two optional capabilities, asked by attribute lookup (`core/capability.py`)::

    class MyScheduler:
        def decisions(self) -> Mapping[str, object]:
            # this iteration's collective decisions: values that compare with ==
            return {"overlap": self.overlapped, "mode": self.mode}

        def rank_local(self) -> Collection[str]:
            # what may differ between ranks (data-parallel attention: each rank its own batch)
            return ("requests", "positions")
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from overlapcheck.core.trace import Launch

# What `rank-consistent` compares in each forward, by the names `rank_local()` may give.
LAUNCH_FIELDS = ("forwards", "phase", "requests", "positions")


@runtime_checkable
class HasDecisions(Protocol):
    """A scheduler's collective decisions, read after each iteration: every rank must return
    equal values under equal keys. Keep rank-local values (a rank's free pages, its clock) out:
    they may differ, and a value that may differ belongs in `rank_local()`."""

    def decisions(self) -> Mapping[str, object]: ...


@runtime_checkable
class DeclaresRankLocal(Protocol):
    """What a scheduler's ranks may legitimately disagree on: names from `LAUNCH_FIELDS` (how
    many forwards an iteration launches, their phase, requests, positions) and keys of its
    `decisions()`. Read once per run."""

    def rank_local(self) -> Collection[str]: ...


class RankLog:
    """One rank as the harness ran it, for `rank-consistent`: its launches (its trace's), where
    each iteration's begin, the decisions it declared after each iteration and whether it said
    it had more to do."""

    def __init__(self, rank: int, launches: list[Launch]) -> None:
        self.rank = rank
        self.launches = launches
        self.marks: list[int] = []  # launches issued before each iteration
        self.decisions: list[Mapping[str, object] | None] = []  # None: no `decisions()`
        self.more: list[bool] = []  # what each `step()` returned

    def begin(self) -> None:
        self.marks.append(len(self.launches))

    def end(self, more: bool, decisions: Mapping[str, object] | None) -> None:
        self.more.append(more)
        self.decisions.append(decisions)

    def launched(self, iteration: int) -> list[Launch]:
        """The forwards launched in one iteration."""
        begin = self.marks[iteration]
        end = self.marks[iteration + 1] if iteration + 1 < len(self.marks) else len(self.launches)
        return self.launches[begin:end]
