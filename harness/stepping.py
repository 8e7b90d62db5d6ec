"""The harness's moving parts: the checks of a run and what a failing one does (stop, or record
and go on), the wrappers around the scheduler's source and sink, the loop that steps the scheduler
(and tells whose crash it is), and the checks deferred to after the run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any, Literal, NamedTuple, Protocol

from overlapcheck.core.errors import InvariantError
from overlapcheck.core.expected import Expected
from overlapcheck.core.messages import AbortMsg, InMsg, OutMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import MessageSource, SchedulerUnderTest
from overlapcheck.core.trace import Message
from overlapcheck.harness.crash import CheckerBug, crash_violation, hang_violation
from overlapcheck.harness.watchdog import StepHung, Watchdog
from overlapcheck.invariants.base import Invariant, InvariantViolated, Violation
from overlapcheck.invariants.context import Request, RunContext, TracePrefix


class Logged(NamedTuple):
    """One event of a run, kept for the checks deferred to after it."""

    kind: Literal["receive", "send", "end"]  # a message received or sent, an iteration's end
    msg: InMsg | OutMsg | None
    step: int  # the iteration
    num_ops: int  # operations issued by then
    time: float


class Checks:
    """The invariants of one run, and what happens when one fails: stop, or record and go on."""

    def __init__(self, checks: list[Invariant], keep_going: bool) -> None:
        self._checks = checks
        self.keep_going = keep_going
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, tuple[int, ...]]] = set()
        self.stopped: Violation | None = None  # stop mode: survives a scheduler that swallows it
        self._listening: dict[str, list[Callable[..., None]]] = {}
        self._ops_at_message = -1  # ops issued when the last message was sent
        self._on_message: list[list[Callable[..., None]]] | None = None

    @property
    def checks(self) -> list[Invariant]:
        return self._checks

    @checks.setter
    def checks(self, checks: list[Invariant]) -> None:
        self._checks = checks
        self._listening = {}
        self._on_message = None

    def call(self, hook: Callable[[Invariant], None], name: str = "") -> None:
        """Call `hook` on every active check (on those that override the hook `name`, if
        given)."""
        for inv in self.listening(name) if name else [c for c in self.checks if c.active]:
            try:
                hook(inv)
            except InvariantViolated as err:
                self.record(err.violation)

    def notify(self, hook: str, *args: Any) -> None:
        """Call the hook `hook` with `args` on the checks that override it, in the checks' order.

        The harness's hot path: several calls per simulated iteration, one per message sent, so
        the bound methods are looked up once per run, not per call.
        """
        for method in self._bound(hook):
            try:
                method(*args)
            except InvariantViolated as err:
                self.record(err.violation)

    def message(
        self, msg: OutMsg, req: Request | None, num_ops: int, routine: bool = False
    ) -> None:
        """A message sent when the trace held `num_ops` ops: check by check in order, its
        `on_ops` (only if ops were issued since the last message: a batch's messages come in a
        burst with no device call between them) and its `on_message` (not for a live request's
        token, if it reads only those that come after their request ended: `ended_only`; not
        for a `routine` token, `RequestLedger.routine`, if it judges none: `judges_routine`)."""
        fresh = num_ops != self._ops_at_message
        self._ops_at_message = num_ops
        calls = self._on_message
        if calls is None:
            calls = self._on_message = self._message_calls()
        live = req is not None and not req.late and isinstance(msg, TokenMsg)
        for method in calls[3 * fresh + live + routine]:
            try:
                method(msg, req)
            except InvariantViolated as err:
                self.record(err.violation)

    def _message_calls(self) -> list[list[Callable[..., None]]]:
        """The calls for a message, by 3 * (ops issued since the last one) + (a live request's
        token) + (a routine one)."""
        ops, messages = set(self.listening("on_ops")), set(self.listening("on_message"))
        calls: list[list[Callable[..., None]]] = []
        for fresh in (False, True):
            for kind in range(3):  # another message, a live request's token, a routine one
                found: list[Callable[..., None]] = []
                for inv in self.checks:
                    if fresh and inv in ops:
                        found.append(inv.ops_at_message)
                    if (
                        inv in messages
                        and not (kind and inv.ended_only)
                        and not (kind == 2 and not inv.judges_routine)
                    ):
                        found.append(inv.on_message)
                calls.append(found)
        return calls

    def listening(self, hook: str) -> list[Invariant]:
        """The active checks that override `hook`: a message goes to the few that read it."""
        base = getattr(Invariant, hook)
        return [inv for inv in self.checks if inv.active and getattr(type(inv), hook) is not base]

    def _bound(self, hook: str) -> list[Callable[..., None]]:
        found = self._listening.get(hook)
        if found is None:
            found = self._listening[hook] = [getattr(inv, hook) for inv in self.listening(hook)]
        return found

    def record(self, violation: Violation) -> None:
        key = (violation.invariant, violation.uids)
        if key not in self._seen:
            self._seen.add(key)
            self.violations.append(violation)
        if not self.keep_going:
            if self.stopped is None:
                self.stopped = violation
            raise InvariantViolated(violation)


class Workload(MessageSource, Protocol):
    """The source the harness wraps: it also hears every message the scheduler sends, since a
    follow-up turn is built from the replies to the turn before."""

    def observe(self, msg: OutMsg, now: float) -> None: ...


class Harness:
    """Wraps the scheduler's source and sink; counts iterations."""

    def __init__(
        self,
        ctx: RunContext,
        checks: Checks,
        source: Workload,
        expected: Callable[[UserMsg, int], Expected | None],
    ) -> None:
        self.ctx = ctx
        self.checks = checks
        self.inner = source
        self.expected = expected
        self._observe = source.observe  # looked up once: called for every message sent
        # (kind, message, iteration, ops issued, time) for the checks deferred to after the run
        self.log: list[Logged] | None = None

    # the MessageSource the scheduler sees
    def poll(self, now: float) -> list[InMsg]:
        msgs = self.inner.poll(now)
        ctx = self.ctx
        for msg in msgs:
            kind = "user" if isinstance(msg, UserMsg) else "abort"
            ctx.trace.received.append(Message(ctx.now(), ctx.step, msg.uid, kind))
            if self.log is not None:
                self.log.append(Logged("receive", msg, ctx.step, len(ctx.trace.ops), ctx.now()))
            req = ctx.ledger.receive(msg, ctx.step, self.expected)
            self.checks.notify("on_receive", msg, req)
            if isinstance(msg, UserMsg):
                ctx.attribution.received(ctx.trace.ops, req)
        return msgs

    def next_arrival(self) -> float | None:
        return self.inner.next_arrival()

    # the sink the scheduler sends to
    def send(self, msg: OutMsg) -> None:
        ctx = self.ctx
        now, step = ctx.now(), ctx.step
        if isinstance(msg, TokenMsg):
            record = Message(now, step, msg.uid, "token", msg.token, msg.finished)
        else:
            record = Message(now, step, msg.uid, "reject", reason=msg.reason)
        ctx.trace.messages.append(record)
        if self.log is not None:
            self.log.append(Logged("send", msg, step, len(ctx.trace.ops), now))
        num_ops = len(ctx.trace.ops)
        ledger = ctx.ledger
        req = ledger.answer(msg, step, num_ops)
        self._observe(msg, now)
        self.checks.message(msg, req, num_ops, ledger.routine)


def drive(
    sched: SchedulerUnderTest,
    ctx: RunContext,
    checks: Checks,
    bound: int,
    log: list[Logged] | None,
    watchdog: Watchdog | None = None,
) -> bool:
    """Step the scheduler until idle; True if the run got to its end-of-run checks.

    `watchdog` times each step: one past its timeout is a `no-hang` finding, and the trace is
    cut back to where that step began (what it did until it was stopped depends on the wall
    clock); its deadline passing raises `DeadlineReached` out of the run."""
    dog = watchdog or Watchdog(None)
    try:
        with dog:
            return _steps(sched, ctx, checks, bound, log, dog)
    except StepHung:
        pass
    began = dog.began
    if checks.stopped is not None:
        return False  # a violation came first; the hang was the scheduler's way out of it
    assert dog.stack is not None and dog.timeout is not None
    ctx.device.trace.cut(*began)
    violation = hang_violation(dog.stack, dog.timeout, ctx.step, began[3])
    if violation is None:
        raise CheckerBug(RuntimeError("overlapcheck hung inside a step"), ctx.scenario)
    record_quietly(checks, violation)
    return False


def _steps(
    sched: SchedulerUnderTest,
    ctx: RunContext,
    checks: Checks,
    bound: int,
    log: list[Logged] | None,
    dog: Watchdog,
) -> bool:
    device, trace = ctx.device, ctx.trace
    try:
        while True:
            device.set_step(ctx.step)
            ctx.scheduler_ran()
            with dog.step((len(trace.ops), len(trace.messages), len(trace.received), ctx.now())):
                more = sched.step()
            if dog.hung:  # the scheduler caught the watchdog's exception and returned
                raise StepHung
            ctx.scheduler_ran()
            if checks.stopped is not None:
                return False  # the scheduler swallowed the violation: it still stands
            if not more:
                break
            checks.notify("on_step_end")
            if log is not None:
                log.append(Logged("end", None, ctx.step, len(ctx.trace.ops), ctx.now()))
            ctx.step += 1
            if ctx.step > bound:
                stuck = tuple(sorted(r.uid for r in ctx.ledger.live.values()))
                checks.record(
                    Violation(
                        "liveness",
                        ctx.step,
                        ctx.now(),
                        stuck,
                        f"not idle after {bound} iterations; requests {list(stuck)} remain",
                    )
                )
                return False
        checks.call(lambda inv: inv.finish())
        return True
    except InvariantViolated:
        return False  # recorded already
    except InvariantError as err:  # the scheduler's own integrity checks, or a device deadlock
        record_quietly(checks, Violation(err.invariant, ctx.step, ctx.now(), (), err.detail))
    except CheckerBug:
        raise
    except Exception as err:
        if dog.hung:  # the scheduler turned the watchdog's exception into one of its own
            raise StepHung from err
        if checks.stopped is not None:
            return False  # an exception after a violation unwound the scheduler: it stands
        violation = crash_violation(err, ctx.step, ctx.now())
        if violation is None:
            raise CheckerBug(err, ctx.scenario) from err
        record_quietly(checks, violation)
    return False


def record_quietly(checks: Checks, violation: Violation) -> None:
    with suppress(InvariantViolated):
        checks.record(violation)


def check_after(
    later: list[Invariant],
    log: list[Logged],
    ran: RunContext,
    keep_going: bool,
    expected: Callable[[UserMsg, int], Expected | None],
    completed: bool,
) -> tuple[list[Violation], list[str]]:
    """The deferred checks, over the run's recorded events: each sees the trace as it stood, the
    time and the iteration of the event, and a request ledger rebuilt event by event."""
    ctx = RunContext(ran.scenario, ran.device, ran.backend_name, ran.scheduler, ran.kv_shadow)
    view = TracePrefix(ran.device.trace)
    ctx.view, ctx.live_books = view, False
    checks = Checks(later, keep_going)
    for inv in later:
        inv.bind(ctx)
    try:
        for event in log:
            msg, step = event.msg, event.step
            ctx.step, ctx.frozen_now = step, event.time
            view.at(event.num_ops)
            if msg is None:
                checks.notify("on_step_end")
            elif isinstance(msg, UserMsg | AbortMsg):
                req = ctx.ledger.receive(msg, step, expected)
                checks.notify("on_receive", msg, req)
                if isinstance(msg, UserMsg):
                    ctx.attribution.received(view.ops, req)
            else:
                req = ctx.ledger.answer(msg, step, event.num_ops)
                checks.message(msg, req, event.num_ops, ctx.ledger.routine)
        if completed:  # the run reached its end-of-run checks: so do these, on the final state
            view.at(len(ran.device.trace.ops))
            ctx.step, ctx.frozen_now, ctx.live_books = ran.step, ran.now(), True
            checks.call(lambda inv: inv.finish())
    except InvariantViolated:
        pass  # recorded
    except Exception as err:
        raise CheckerBug(err, ran.scenario) from err
    return checks.violations, ctx.notices
