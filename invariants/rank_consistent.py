"""`rank-consistent`: every rank launches what rank 0 launches and decides what it decides.

Checked only where a run has several ranks (`num_ranks > 1`, `--ranks N`; `core/ranks.py`): at
the end of each iteration, once every rank has run it, each rank's forwards of that iteration
(how many, and each one's phase, requests in order and new positions) and its declared decisions
are compared with rank 0's. The first difference is the finding: the iteration, the two ranks,
what differs and both values. Slots, pages and whatever else a rank keeps for itself are never
compared, nor what the scheduler declares rank-local (`rank_local()`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from overlapcheck.core.capability import provides
from overlapcheck.core.ranks import DeclaresRankLocal, RankLog
from overlapcheck.core.trace import Launch
from overlapcheck.invariants.base import Invariant, InvariantViolated, Violation

if TYPE_CHECKING:
    from overlapcheck.invariants.context import RunContext

_ABSENT = object()


class RankConsistent(Invariant):
    """Every rank launches what rank 0 launches, iteration by iteration, and makes the decisions it
    declares alike."""

    id = "rank-consistent"
    deferrable = False  # it reads the other ranks' logs as they run

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        self.logs: list[RankLog] = run.ranks
        self.active = len(self.logs) > 1
        self.compared = 0  # iterations compared so far
        scheduler = run.scheduler
        local = (
            cast(DeclaresRankLocal, scheduler).rank_local()
            if provides(scheduler, DeclaresRankLocal)
            else ()
        )
        self.local = frozenset(local)

    def on_step_end(self) -> None:
        self._compare()

    def finish(self) -> None:
        self._compare()

    def _compare(self) -> None:
        first = self.logs[0]
        done = min(len(log.more) for log in self.logs)
        while self.compared < done:
            iteration = self.compared
            for other in self.logs[1:]:
                self._pair(iteration, first, other)
            self.compared += 1

    def _pair(self, iteration: int, a: RankLog, b: RankLog) -> None:
        if a.more[iteration] != b.more[iteration]:
            going, idle = (a, b) if a.more[iteration] else (b, a)
            self._differ(
                iteration,
                a,
                b,
                "whether there is more to do",
                a.more[iteration],
                b.more[iteration],
                f"rank {going.rank} has more to do, rank {idle.rank} is idle",
            )
        mine, theirs = a.launched(iteration), b.launched(iteration)
        if len(mine) != len(theirs) and "forwards" not in self.local:
            self._differ(
                iteration,
                a,
                b,
                "forwards",
                len(mine),
                len(theirs),
                f"rank {a.rank} launched {len(mine)} forward(s), rank {b.rank} {len(theirs)}",
            )
        for index, (x, y) in enumerate(zip(mine, theirs, strict=False)):
            self._launch(iteration, index, a, b, x, y)
        self._decisions(iteration, a, b)

    def _launch(
        self, iteration: int, index: int, a: RankLog, b: RankLog, x: Launch, y: Launch
    ) -> None:
        which = f"forward {index + 1} of the iteration ({self._label(x)} on rank {a.rank})"
        for name, mine, theirs in (
            ("phase", x.phase, y.phase),
            ("requests", list(x.uids), list(y.uids)),
            ("positions", _positions(x), _positions(y)),
        ):
            if name in self.local or mine == theirs:
                continue
            if name == "positions" and x.uids == y.uids:
                for uid, p, q in zip(x.uids, x.positions, y.positions, strict=True):
                    if p != q:
                        mine, theirs = f"request {uid} at {_span(p)}", f"at {_span(q)}"
                        break
            self._differ(
                iteration,
                a,
                b,
                name,
                mine,
                theirs,
                f"{which}: {name} differ: rank {a.rank} {mine}, rank {b.rank} {theirs}",
                uids=tuple(sorted(set(x.uids) ^ set(y.uids)) or x.uids),
            )

    def _decisions(self, iteration: int, a: RankLog, b: RankLog) -> None:
        mine, theirs = a.decisions[iteration], b.decisions[iteration]
        if mine is None and theirs is None:
            return
        left: Mapping[str, object] = mine or {}
        right: Mapping[str, object] = theirs or {}
        for key in sorted({*left, *right}, key=str):
            if key in self.local:
                continue
            x, y = left.get(key, _ABSENT), right.get(key, _ABSENT)
            if x != y:
                shown = ["(none)" if v is _ABSENT else repr(v) for v in (x, y)]
                self._differ(
                    iteration,
                    a,
                    b,
                    f"decision {key!r}",
                    shown[0],
                    shown[1],
                    f"decision {key!r} differs: rank {a.rank} {shown[0]}, rank {b.rank} {shown[1]}",
                )

    def _label(self, launch: Launch) -> str:
        ops = self.run.trace.ops
        return ops[launch.seq].label if launch.seq < len(ops) else "?"

    def _differ(
        self,
        iteration: int,
        a: RankLog,
        b: RankLog,
        what: str,
        mine: object,
        theirs: object,
        message: str,
        uids: tuple[int, ...] = (),
    ) -> None:
        details = {
            "iteration": iteration,
            "ranks": [a.rank, b.rank],
            "differs": what,
            "values": [str(mine), str(theirs)],
        }
        text = f"ranks {a.rank} and {b.rank} diverge at iteration {iteration}: {message}"
        raise InvariantViolated(Violation(self.id, iteration, self.run.now(), uids, text, details))


def _positions(launch: Launch) -> list[str]:
    return [_span(p) for p in launch.positions]


def _span(p: tuple[int, int]) -> str:
    return f"[{p[0]}, {p[1]})"
