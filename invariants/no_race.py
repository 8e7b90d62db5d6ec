"""The `no-race` invariant: no conflicting accesses unordered by happens-before."""

from __future__ import annotations

from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import RunContext
from overlapcheck.invariants.hbgraph import explain
from overlapcheck.invariants.races import RaceDetector


class NoRace(Invariant):
    id = "no-race"

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        self.detector = RaceDetector(run.clocks)

    def on_step_end(self) -> None:
        self.on_ops()

    def on_ops(self) -> None:
        # A race that corrupted this message is the better report than the oracle's. Only new
        # ops need checking (most steps end with none issued since their first message).
        if self.detector.checked != len(self.run.trace.ops):
            self.check()

    def finish(self) -> None:
        self.check()

    def check(self) -> None:
        trace = self.run.trace
        race = self.detector.check(trace)
        if race is None:
            return
        first, second = trace.ops[race.first], trace.ops[race.second]
        uids = tuple(sorted(set(first.uids) | set(second.uids)))
        self.fail(
            f"{race.kind} on {race.buffer} cells {list(race.cells)}: {first.agent} "
            f"`{first.label or first.kind}` (step {first.step}, {first.phase}) vs {second.agent} "
            f"`{second.label or second.kind}` (step {second.step}, {second.phase}); "
            f"{explain(trace, first, second, self.detector.clocks)}",
            uids,
            kind=race.kind,
            buffer=race.buffer,
            cells=list(race.cells),
            first=first.identity(),
            second=second.identity(),
        )
