"""What a device replay does to the real run: gates that force the counterexample's race, or,
where no gate can express an order, the simulator's delays as sleeps.

The simulator's run of the counterexample shows the race: two unordered operations, the one
issued later having run before the earlier one was done. A gate holds the earlier one until the
later one has run, whatever the timing (`backends/gates.py`); the delays that got the simulator
there are then not needed, and the plan says that each one was replaced. Without a race to force
(a fault that breaks the books, not the data), or where the two cannot be ordered by a gate, the
delays stay sleeps, as the plan says for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlapcheck.backends.delays import Delay, OpKeys, delay_plan
from overlapcheck.backends.gates import Gate
from overlapcheck.core.trace import HOST, Trace
from overlapcheck.invariants.races import Race, RaceDetector


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    gates: tuple[Gate, ...]
    delays: tuple[Delay, ...]  # every delay of the simulator's run, in issue order
    no_gate: str = ""  # why the delays stay sleeps ("" when gates replace them)

    @property
    def sleeps(self) -> list[Delay]:
        """The delays injected as sleeps."""
        return [] if self.gates else list(self.delays)

    def without_gates(self) -> ReplayPlan:
        return ReplayPlan((), self.delays, "a warm-up run")

    def lines(self) -> list[str]:
        out = [f"gate {i + 1}: {g.line()}" for i, g in enumerate(self.gates)]
        names = ", ".join(str(i + 1) for i in range(len(self.gates)))
        for d in self.delays:
            how = f"replaced by gate {names}" if self.gates else f"sleep ({self.no_gate})"
            out.append(f"{d.line()} -> {how}")
        if not self.gates and not self.delays:
            out.append(f"no gate, no delay ({self.no_gate})")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "gates": [g.to_json() for g in self.gates],
            "delays": len(self.delays),
            "sleeps": len(self.sleeps),
            "no_gate": self.no_gate,
            "lines": self.lines(),
        }


def race_gate(trace: Trace, race: Race) -> Gate | str:
    """The gate that forces `race` as the trace ran it, or why there is none."""
    held, opener = trace.ops[race.first], trace.ops[race.second]
    if held.agent == HOST:
        return "the race's earlier op is the host's, which runs when it is issued"
    if opener.agent == held.agent:
        return "both ops are on one stream"
    if opener.start is None or (held.end is not None and opener.start >= held.end):
        return "in the simulator's run the race's ops ran in issue order"
    keys = OpKeys(trace)
    return Gate(
        keys.of(held.seq),
        held.label or held.kind,
        keys.of(opener.seq),
        opener.label or opener.kind,
        f"{race.kind} on {race.buffer}",
    )


def plan_replay(trace: Trace, gates_unavailable: str | None = None) -> ReplayPlan:
    """The plan for a simulated counterexample's `trace`; `gates_unavailable` says why the
    device cannot gate (None: it can)."""
    delays = tuple(delay_plan(trace))
    race = RaceDetector().check(trace)
    if race is None:
        return ReplayPlan((), delays, "no race to force")
    gate = race_gate(trace, race)
    if isinstance(gate, str):
        return ReplayPlan((), delays, gate)
    if gates_unavailable:
        return ReplayPlan((), delays, gates_unavailable)
    return ReplayPlan((gate,), delays)
