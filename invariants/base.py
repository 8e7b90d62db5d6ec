"""The invariant protocol: hooks the harness calls as the run goes, and an end-of-run check.

Hooks see the run as any scheduler produces it (messages in and out, the trace). Checks that need
a scheduler's books ask `self.run.books()`, which is None for a scheduler without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overlapcheck.core.messages import InMsg, OutMsg
from overlapcheck.core.sites import Location

if TYPE_CHECKING:
    from overlapcheck.invariants.context import Request, RunContext


@dataclass(frozen=True, slots=True)
class Violation:
    """A broken invariant: where, who, why; races carry the two accesses.

    `locations`: the places in the scheduler's code the finding points at, first the one to
    look at (`core/sites.py`): structured, for `--json`, SARIF and reports; the message's prose
    names them too."""

    invariant: str
    step: int
    time: float
    uids: tuple[int, ...]
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    locations: tuple[Location, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "step": self.step,
            "time": self.time,
            "uids": list(self.uids),
            "message": self.message,
            "details": self.details,
            "locations": [loc.to_json() for loc in self.locations],
        }

    def line(self) -> str:
        who = f" uids {list(self.uids)}" if self.uids else ""
        return f"[{self.invariant}] step {self.step}{who}: {self.message}"


class InvariantViolated(Exception):
    """Raised by an online check to stop the run at the first violating step."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.line())
        self.violation = violation


class Invariant:
    """One invariant. `bind` gives it the run; `finish` runs the end-of-run check.

    `needs_books`: the check reads the scheduler's books; without them it is skipped (one notice).
    `needs_kv_shadow`: the check reads the device's KV shadow (`RunContext.kv_shadow`), which the
    harness asks the backend for only then.
    `deferrable`: see below; a check that reads live state (books, the device) is not.
    `active`: False (set in `bind`) when the check does not apply to this run's configuration
    (speculation's checks without speculation, say): the harness then calls none of its hooks,
    so it costs nothing.
    `ended_only`: `on_message` judges nothing in a token for a request that was live when it
    came (`not req.late`), so the harness calls it only for the other messages.
    `judges_routine`: False where `on_message` judges nothing in a routine token (a live
    request's token that is neither its last nor EOS, and equal to the reference's where it has
    exact ones: `RequestLedger.routine`), most of a run's messages; the harness then does not
    call it for one.
    """

    id: str = ""
    needs_books: bool = False
    needs_kv_shadow: bool = False
    # Judged from the trace and the messages alone, so it may run after the run over the recorded
    # events (on a real device, so that its host time cannot move the timing under test).
    deferrable: bool = True
    active: bool = True
    ended_only: bool = False
    judges_routine: bool = True

    def bind(self, run: RunContext) -> None:
        self.run = run

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        """A message handed to the scheduler; `req` is the request it creates or targets."""
        return None

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        """A message the scheduler sent; `req` is the request it belongs to (None: unknown uid)."""
        return None

    def on_ops(self) -> None:
        """Ops were issued since the last message: judge them before this check's `on_message`
        (the harness skips the call for the other messages of a burst: nothing changed)."""
        return None

    def ops_at_message(self, msg: OutMsg, req: Request | None) -> None:
        """`on_ops`, called the way the harness calls message hooks."""
        self.on_ops()

    def on_step_end(self) -> None:
        return None

    def finish(self) -> None:
        return None

    def repeats(self, uids: tuple[int, ...]) -> bool:
        """A finding of this check's for `uids` would be dropped as a repeat (`RunContext.repeats`):
        a check that finds it again may skip writing its report, the costly part."""
        # (a stand-in context without `repeats`, a test's, repeats nothing)
        return (self.id, uids) in getattr(self.run, "repeats", ())

    def fail(
        self,
        message: str,
        uids: tuple[int, ...] = (),
        locations: tuple[Location, ...] = (),
        **details: Any,
    ) -> None:
        self.fail_as(self.id, message, uids, locations, **details)

    def fail_as(
        self,
        invariant: str,
        message: str,
        uids: tuple[int, ...] = (),
        locations: tuple[Location, ...] = (),
        **details: Any,
    ) -> None:
        raise InvariantViolated(
            Violation(invariant, self.run.step, self.run.now(), uids, message, details, locations)
        )


class TraceScanner(Invariant):
    """A check that judges the trace's new ops as they come: `_scan` at each step's end and once
    more at the end of the run."""

    def on_step_end(self) -> None:
        self._scan()

    def finish(self) -> None:
        self._scan()

    def _scan(self) -> None:
        raise NotImplementedError
