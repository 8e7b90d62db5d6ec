"""The harness's moving parts: the checks of a run and what a failing one does (stop, or record
and go on), the wrappers around the scheduler's source and sink, the loop that steps the scheduler
(and tells whose crash it is), and the checks deferred to after the run.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from contextlib import suppress
from typing import Any, Literal, NamedTuple, Protocol

from overlapcheck.core.errors import DeviceFault, InvariantError, UserError
from overlapcheck.core.expected import Expected
from overlapcheck.core.messages import AbortMsg, InMsg, OutMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import MessageSource, SchedulerUnderTest
from overlapcheck.core.sites import Location, raised_at
from overlapcheck.core.trace import Message
from overlapcheck.harness.crash import (
    CheckerBug,
    RankProcessDied,
    crash_violation,
    hang_violation,
)
from overlapcheck.harness.watchdog import DeadlineReached, RemoteHung, StepHung, Watchdog
from overlapcheck.invariants.base import Invariant, InvariantViolated, Violation
from overlapcheck.invariants.context import Request, RunContext, TracePrefix
from overlapcheck.invariants.locations import locations, op_location
from overlapcheck.invariants.registry import INVARIANTS


class Logged(NamedTuple):
    """One event of a run, kept for the checks deferred to after it."""

    kind: Literal["receive", "send", "end"]  # a message received or sent, an iteration's end
    msg: InMsg | OutMsg | None
    step: int  # the iteration
    num_ops: int  # operations issued by then
    time: float


# What a sent message is, for which checks hear it (`Checks.message`).
OTHER_MESSAGE, LIVE_TOKEN, ROUTINE_TOKEN = 0, 1, 2
_KINDS = (OTHER_MESSAGE, LIVE_TOKEN, ROUTINE_TOKEN)
_MessageCalls = tuple[list[Callable[..., None]], ...]  # by kind


def _overriding(checks: list[Invariant], hook: Callable[..., None]) -> list[Invariant]:
    """The active checks whose class overrides `hook` (a method of `Invariant`): a message goes
    to the few that read it."""
    name = hook.__name__
    return [inv for inv in checks if inv.active and getattr(type(inv), name) is not hook]


class _Hooks(NamedTuple):
    """The bound hooks a run calls, each list in the checks' order."""

    on_receive: list[Callable[..., None]]
    on_step_end: list[Callable[..., None]]
    # by whether ops were issued since the last message, then by the message's kind: a check's
    # `ops_at_message` when fresh, then its `on_message` unless it reads only ended requests'
    # tokens (`ended_only`) or judges no routine token (`judges_routine`)
    on_message: tuple[_MessageCalls, _MessageCalls]

    @classmethod
    def of(cls, checks: list[Invariant]) -> _Hooks:
        ops = set(_overriding(checks, Invariant.on_ops))
        messages = set(_overriding(checks, Invariant.on_message))

        def calls(fresh: bool, kind: int) -> list[Callable[..., None]]:
            found: list[Callable[..., None]] = []
            for inv in checks:
                if fresh and inv in ops:
                    found.append(inv.ops_at_message)
                if (
                    inv in messages
                    and not (kind != OTHER_MESSAGE and inv.ended_only)
                    and not (kind == ROUTINE_TOKEN and not inv.judges_routine)
                ):
                    found.append(inv.on_message)
            return found

        return cls(
            on_receive=[inv.on_receive for inv in _overriding(checks, Invariant.on_receive)],
            on_step_end=[inv.on_step_end for inv in _overriding(checks, Invariant.on_step_end)],
            on_message=(
                tuple(calls(False, kind) for kind in _KINDS),
                tuple(calls(True, kind) for kind in _KINDS),
            ),
        )


class Checks:
    """The invariants of one run, and what happens when one fails: stop, or record and go on."""

    def __init__(
        self, checks: list[Invariant], keep_going: bool, judged: frozenset[str] | None = None
    ) -> None:
        self._checks = checks
        # every check the run judges, those deferred to after it included
        self.judged = frozenset(c.id for c in checks) if judged is None else judged
        self.keep_going = keep_going
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, tuple[int, ...]]] = set()
        self.stopped: Violation | None = None  # stop mode: survives a scheduler that swallows it
        self._ops_at_message = -1  # ops issued when the last message was sent
        self._hooks: _Hooks | None = None

    @property
    def checks(self) -> list[Invariant]:
        return self._checks

    @checks.setter
    def checks(self, checks: list[Invariant]) -> None:
        self._checks = checks
        self._hooks = None

    @property
    def hooks(self) -> _Hooks:
        """The bound hooks of the active checks that override them, looked up once per run: the
        harness calls them several times per simulated iteration."""
        hooks = self._hooks
        if hooks is None:
            hooks = self._hooks = _Hooks.of(self.checks)
        return hooks

    def _run(self, calls: list[Callable[..., None]], *args: Any) -> None:
        for method in calls:
            try:
                method(*args)
            except InvariantViolated as err:
                self.record(err.violation)

    def received(self, msg: InMsg, req: Request | None) -> None:
        """A message the scheduler received (`on_receive`)."""
        self._run(self.hooks.on_receive, msg, req)

    def step_ended(self) -> None:
        """An iteration of the scheduler ended (`on_step_end`)."""
        self._run(self.hooks.on_step_end)

    def finish(self) -> None:
        """The run ended: every active check's `finish`."""
        self._run([c.finish for c in self.checks if c.active])

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
        # (a routine token is a live request's token)
        if routine:
            kind = ROUTINE_TOKEN
        elif req is not None and not req.late and isinstance(msg, TokenMsg):
            kind = LIVE_TOKEN
        else:
            kind = OTHER_MESSAGE
        for method in self.hooks.on_message[fresh][kind]:
            try:
                method(msg, req)
            except InvariantViolated as err:
                self.record(err.violation)

    def before_crash(self) -> bool:
        """The checks of the trace so far (`on_ops`), where the run ends with an exception: a
        race or a read of never-written memory behind it is the cause to report. True if one
        stopped the run."""
        for inv in _overriding(self.checks, Invariant.on_ops):
            try:
                inv.on_ops()
            except InvariantViolated as err:
                record_quietly(self, err.violation)
        return self.stopped is not None

    @property
    def repeats(self) -> Container[tuple[str, tuple[int, ...]]]:
        """The findings a check need not report again, by (invariant, uids): those recorded,
        where the run goes on after one (`record` drops a repeat); none where it stops."""
        return self._seen if self.keep_going else frozenset()

    def judges(self, invariant: str) -> bool:
        """False for a registered invariant that this run does not check (skipped): a finding
        of that kind from outside the checks (the step bound, a device deadlock) is not
        reported either. A name no check has (a scheduler's own integrity check) is judged."""
        return invariant in self.judged or invariant not in INVARIANTS

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
            self.checks.received(msg, req)
            if isinstance(msg, UserMsg):
                ctx.attribution.received(ctx.trace.ops, req)
        return msgs

    def next_arrival(self) -> float | None:
        return self.inner.next_arrival()

    def idling(self) -> None:
        idling = getattr(self.inner, "idling", None)
        if idling is not None:
            idling()

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
    except StepHung as hung:
        if isinstance(hung, RemoteHung):  # where it stood is in a rank's process
            dog.stack = hung.stack
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
            checks.step_ended()
            if log is not None:
                log.append(Logged("end", None, ctx.step, len(ctx.trace.ops), ctx.now()))
            ctx.step += 1
            if ctx.step > bound:
                if not checks.judges("liveness"):
                    return False  # skipped: the run ends at the bound, unjudged past it
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
        checks.finish()
        return True
    except InvariantViolated:
        return False  # recorded already
    except DeviceFault as fault:  # a kernel of the program's failed on the simulated device
        if checks.before_crash() or not checks.judges(fault.invariant):
            return False
        while not fault.ops and isinstance(fault.__cause__, DeviceFault):
            fault = fault.__cause__  # SimPy raises a copy made of the args, the original its cause
        uids = tuple(sorted({uid for op in fault.ops for uid in op.uids}))
        at = locations(*(op_location("launch", op) for op in fault.ops))
        record_quietly(
            checks,
            Violation("no-crash", ctx.step, ctx.now(), uids, fault.detail, fault.details, at),
        )
    except InvariantError as err:  # the scheduler's own integrity checks, or a device deadlock
        if not checks.judges(err.invariant):
            return False  # a check the user skipped (`--skip liveness`): the run ends unjudged
        site = raised_at(err.__traceback__)
        at = () if site is None else (Location.of("call", site, "host", ctx.step),)
        record_quietly(
            checks, Violation(err.invariant, ctx.step, ctx.now(), (), err.detail, locations=at)
        )
    except (CheckerBug, RankProcessDied, UserError):  # (UserError: a request the adapter
        raise  # cannot hand its engine, a one-line refusal, never the scheduler's crash)
    except Exception as err:
        if dog.hung:  # the scheduler turned the watchdog's exception into one of its own
            raise StepHung from err
        if dog.deadline_raised:  # the same with the search's deadline: the example is unjudged
            raise DeadlineReached from err
        if checks.stopped is not None:
            return False  # an exception after a violation unwound the scheduler: it stands
        if checks.before_crash():
            return False  # a race or a never-written read came first: the cause
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
    ctx.repeats = checks.repeats
    for inv in later:
        inv.bind(ctx)
    try:
        for event in log:
            msg, step = event.msg, event.step
            ctx.step, ctx.frozen_now = step, event.time
            view.at(event.num_ops)
            if msg is None:
                checks.step_ended()
            elif isinstance(msg, UserMsg | AbortMsg):
                req = ctx.ledger.receive(msg, step, expected)
                checks.received(msg, req)
                if isinstance(msg, UserMsg):
                    ctx.attribution.received(view.ops, req)
            else:
                req = ctx.ledger.answer(msg, step, event.num_ops)
                checks.message(msg, req, event.num_ops, ctx.ledger.routine)
        if completed:  # the run reached its end-of-run checks: so do these, on the final state
            view.at(len(ran.device.trace.ops))
            ctx.step, ctx.frozen_now, ctx.live_books = ran.step, ran.now(), True
            checks.finish()
    except InvariantViolated:
        pass  # recorded
    except Exception as err:
        raise CheckerBug(err, ran.scenario) from err
    return checks.violations, ctx.notices
