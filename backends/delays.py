"""Delay plans: a simulator counterexample's timing, as delays to inject on a real device.

Every operation whose simulated duration exceeded its nominal one becomes a delay just before the
matching real operation: on its stream for stream work (`torch.cuda._sleep`), in the matching host
phase for host work. Operations are matched by (iteration, agent, kind, ordinal), which is stable as
long as the real run makes the same scheduling decisions, which delivering messages at the same
iterations ensures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from overlapcheck.core.trace import Trace

Key = tuple[int, str, str, int]


@dataclass(frozen=True, slots=True)
class Delay:
    step: int
    agent: str
    kind: str
    ordinal: int  # among the ops of this step, agent and kind, in issue order
    label: str
    seconds: float

    @property
    def key(self) -> Key:
        return (self.step, self.agent, self.kind, self.ordinal)

    def line(self) -> str:
        where = "host phase" if self.agent == "host" else f"{self.agent} stream, before"
        return f"step {self.step:>3}  {where} `{self.label}`: +{self.seconds * 1e6:.1f} µs"


class OpKeys:
    """Each op's key, (iteration, agent, kind, ordinal), as ops are appended to a trace."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.keys: list[Key] = []  # of trace.ops[: len(keys)]
        self._seen: dict[tuple[int, str, str], int] = {}

    def of(self, seq: int) -> Key:
        ops, keys, seen = self.trace.ops, self.keys, self._seen
        while len(keys) <= seq:
            op = ops[len(keys)]
            group = (op.step, op.agent, op.kind)
            ordinal = seen.get(group, 0)
            seen[group] = ordinal + 1
            keys.append((*group, ordinal))
        return keys[seq]


def delay_plan(trace: Trace) -> list[Delay]:
    """The delays of a (simulated) trace, in issue order."""
    keys = OpKeys(trace)
    return [
        Delay(*keys.of(op.seq), op.label or op.kind, op.delay) for op in trace.ops if op.delay > 0
    ]


class DelayInjector:
    """Looks up, as a real run issues its operations, the delay each one should get."""

    def __init__(self, plan: Iterable[Delay]) -> None:
        self.by_key = {d.key: d for d in plan}
        self.seen: dict[tuple[int, str, str], int] = {}
        self.applied: list[Delay] = []

    def take(self, step: int, agent: str, kind: str) -> float:
        """Seconds to delay the next (`step`, `agent`, `kind`) operation; call once per op."""
        group = (step, agent, kind)
        ordinal = self.seen.get(group, 0)
        self.seen[group] = ordinal + 1
        delay = self.by_key.get((step, agent, kind, ordinal))
        if delay is None:
            return 0.0
        self.applied.append(delay)
        return delay.seconds

    @property
    def missed(self) -> list[Delay]:
        """Planned delays whose operation the real run never issued (its decisions diverged)."""
        applied = {d.key for d in self.applied}
        return [d for d in self.by_key.values() if d.key not in applied]
