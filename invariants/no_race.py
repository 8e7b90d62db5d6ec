"""The `no-race` invariant: no conflicting accesses unordered by happens-before."""

from __future__ import annotations

from overlapcheck.core.trace import Op, Reuse
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.context import RunContext
from overlapcheck.invariants.hbgraph import explain
from overlapcheck.invariants.locations import (
    locations,
    op_location,
    reuse_between,
    reuse_locations,
    where,
)
from overlapcheck.invariants.races import RaceDetector

# Each race kind's accesses, first then second in issue order.
_ROLES = {"RAW": ("write", "read"), "WAR": ("read", "write"), "WAW": ("write", "write")}


class NoRace(Invariant):
    """No two accesses to the same cells, one a write, are unordered by happens-before (stream
    order, host issue, event record -> wait, host waits)."""

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
        if self.repeats(uids):
            return  # (a race that recurs every iteration: its report written once)
        roles = _ROLES[race.kind]
        one, two = op_location(roles[0], first), op_location(roles[1], second)
        reuse = reuse_between(trace, race.buffer, first, second)
        story = ""
        if reuse is None:
            found = locations(two, one)  # the unordered later access: where a wait goes
        else:
            # The line to fix is the old tensor's use on the other stream: record_stream there.
            found = locations(one, *reuse_locations(reuse), two)
            story = _reuse_story(reuse, first)
        self.fail(
            f"{race.kind} on {race.buffer} cells {list(race.cells)}: {first.agent} "
            f"`{first.label or first.kind}` (step {first.step}, {first.phase}) vs {second.agent} "
            f"`{second.label or second.kind}` (step {second.step}, {second.phase}); "
            f"{explain(trace, first, second, self.detector.clocks)}{story}"
            + (f" [{where(found)}]" if found else ""),
            uids,
            found,
            kind=race.kind,
            buffer=race.buffer,
            cells=list(race.cells),
            first=first.identity(),
            second=second.identity(),
        )


def _reuse_story(reuse: Reuse, first: Op) -> str:
    """What the caching allocator did between the two accesses, and the edge that orders it."""
    freed = "" if reuse.freed is None else f" at step {reuse.freed_step}"
    if reuse.source is None:
        what = f"the tensor was freed{freed} and its block reused by the caching allocator for a"
        what += " tensor"
    else:  # another dtype, or bytes of several freed tensors: a buffer of its own
        what = (
            f"the tensor {reuse.source} was freed{freed} and its memory reused by the caching "
            f"allocator for {reuse.buffer}, a tensor of another dtype or place,"
        )
    return (
        f"; {what} on {reuse.stream} (step {reuse.reused_step}) while {first.agent}'s "
        f"`{first.label or first.kind}` may still use it: a missing `record_stream` of "
        f"{first.agent} on the freed tensor (or {reuse.stream} `wait_stream` {first.agent} "
        "before the allocation)"
    )
