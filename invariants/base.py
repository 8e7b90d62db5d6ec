"""The invariant protocol: listeners that check online and once more at the end of a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overlapcheck.reference.listener import SchedulerListener

if TYPE_CHECKING:
    from overlapcheck.runner import RunContext


@dataclass(frozen=True, slots=True)
class Violation:
    """A broken invariant: where, who, why; races carry the two accesses."""

    invariant: str
    step: int
    time: float
    uids: tuple[int, ...]
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "step": self.step,
            "time": self.time,
            "uids": list(self.uids),
            "message": self.message,
            "details": self.details,
        }

    def line(self) -> str:
        who = f" uids {list(self.uids)}" if self.uids else ""
        return f"[{self.invariant}] step {self.step}{who}: {self.message}"


class InvariantViolated(Exception):
    """Raised by an online check to stop the run at the first violating step."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.line())
        self.violation = violation


class Invariant(SchedulerListener):
    """One invariant. `bind` gives it the run; `finish` runs the end-of-run check."""

    id: str = ""

    def bind(self, run: RunContext) -> None:
        self.run = run

    def fail(self, message: str, uids: tuple[int, ...] = (), **details: Any) -> None:
        self.fail_as(self.id, message, uids, **details)

    def fail_as(
        self, invariant: str, message: str, uids: tuple[int, ...] = (), **details: Any
    ) -> None:
        sched = self.run.scheduler
        raise InvariantViolated(
            Violation(invariant, sched.step_no, sched.device.now(), uids, message, details)
        )

    def finish(self) -> None:
        return None
