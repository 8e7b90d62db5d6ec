"""What invariants read about a run: the harness's view of every request, and the run itself.

The harness sees requests as the messages show them, so every check here works for any scheduler.
Requests are instances, not uids: a uid may come back after its request finished (a new request),
or while it is live (a duplicate the scheduler must reject).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast, overload

from overlapcheck.core.capability import provides
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.expected import ExactTokens
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.messages import AbortMsg, InMsg, OutMsg, RejectMsg, UserMsg
from overlapcheck.core.protocol import Books, HasBooks, HasVocabulary
from overlapcheck.core.ranks import RankLog
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.trace import Op, Trace, TraceView
from overlapcheck.invariants.forward_shape import ForwardIndex, ShapeCache
from overlapcheck.invariants.races import Clocks

if TYPE_CHECKING:
    from overlapcheck.core.expected import Expected
    from overlapcheck.core.scenario import Scenario


@dataclass(eq=False, slots=True)
class Request:
    """One request instance, as received and answered."""

    index: int  # order of arrival among user messages
    msg: UserMsg
    received_step: int
    max_output: int
    rejection: str | None  # why the rules say it must be rejected; None: it must be served
    expected: Expected | None = None  # the oracle's output for it; None: not checked
    tokens: list[int] = field(default_factory=list)
    finished_step: int | None = None
    aborted_step: int | None = None
    rejected: bool = False
    reject_reason: str = ""
    late: bool = False  # the last message for it came after it ended (finished or aborted)
    # ops issued when its first finished message went out (even one after it ended); None: none
    finish_ops: int | None = None

    @property
    def uid(self) -> int:
        return self.msg.uid

    @property
    def live(self) -> bool:
        """Accepted and not yet ended by a finished message or an abort."""
        return (
            self.rejection is None
            and not self.rejected
            and self.finished_step is None
            and self.aborted_step is None
        )


class RequestLedger:
    """Every request instance as the harness saw it (not the scheduler's `books()`), and which one
    a uid's message belongs to."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.requests: list[Request] = []
        self.live: dict[int, Request] = {}  # uid -> its live request
        self.latest: dict[int, Request] = {}  # uid -> its most recent request
        self._to_reject: dict[int, list[Request]] = {}  # uid -> requests owed a RejectMsg
        self.token_messages = 0  # sent so far, for any uid
        self.finishes = 0  # requests whose `finish_ops` is set (their first finished message)
        # The last message answered was a routine token: a live request's, neither its last
        # (not finished, below its max_tokens) nor EOS, and the reference's token there where
        # the request has an exact one. Most checks judge nothing in one, the oracle included.
        self.routine = False

    def receive(
        self, msg: InMsg, step: int, expected: Callable[[UserMsg, int], Expected | None]
    ) -> Request | None:
        """Book an incoming message; the request it creates (user) or targets (abort)."""
        if isinstance(msg, AbortMsg):
            req = self.live.pop(msg.uid, None)
            if req is not None:
                req.aborted_step = step
            return req
        reason = rejection(self.config, msg, live=msg.uid in self.live)
        limit = max_output(self.config, msg)
        req = Request(len(self.requests), msg, step, limit, reason)
        self.requests.append(req)
        self.latest[msg.uid] = req
        if reason is None:
            req.expected = expected(msg, limit)
            self.live[msg.uid] = req
        else:
            self._to_reject.setdefault(msg.uid, []).append(req)
        return req

    def answer(self, msg: OutMsg, step: int, num_ops: int) -> Request | None:
        """Book an outgoing message, sent when the trace held `num_ops` ops; the request it
        belongs to (None: a uid never received)."""
        self.routine = False
        if isinstance(msg, RejectMsg):
            owed = self._to_reject.get(msg.uid)
            req = owed.pop(0) if owed else self.live.pop(msg.uid, None) or self.latest.get(msg.uid)
            if req is not None:
                req.rejected = True
                req.reject_reason = msg.reason
            return req
        self.token_messages += 1
        req = self.live.get(msg.uid) or self.latest.get(msg.uid)
        if req is None:
            return None
        if msg.finished and req.finish_ops is None:
            req.finish_ops = num_ops
            self.finishes += 1
        req.late = not req.live
        if req.live:
            req.tokens.append(msg.token)
            if msg.finished:
                req.finished_step = step
                del self.live[msg.uid]
            else:
                k = len(req.tokens)
                expected = req.expected
                # (`ExactTokens.matches`, inline: this runs for every token of every run; with a
                # reference judged some other way, no token is routine)
                self.routine = (
                    msg.token != self.config.eos_token_id
                    and k < req.max_output
                    and (
                        expected is None
                        or (
                            type(expected) is ExactTokens
                            and k <= len(expected.tokens)
                            and expected.tokens[k - 1] == msg.token
                        )
                    )
                )
        return req

    def owed_rejections(self) -> list[Request]:
        return [r for owed in self._to_reject.values() for r in owed]


# A forward with the request instance of each of its sequences (None: none known for the uid).
Attributed = tuple[Op, tuple[Request | None, ...]]


class Attribution:
    """The run's forwards (`ForwardIndex`) in issue order, each with the request instance of each
    of its sequences: attributed once, for every check that reads them (each attributing them
    again cost more than its own work on them). The harness books each user message with
    `received` after the checks' `on_receive` (which pull first), so a forward issued before a
    uid came back stays with the earlier request."""

    def __init__(self, index: ForwardIndex) -> None:
        self.index = index
        self.current: dict[int, Request] = {}  # uid -> the instance its forwards run for now
        self.forwards: list[Attributed] = []

    def update(self, ops: Sequence[Op]) -> list[Attributed]:
        """Every forward among `ops` (the run's trace as issued so far), attributed."""
        index, done = self.index, len(self.forwards)
        index.update(ops)
        if done != len(index.forwards):
            attribute = self.current.get
            self.forwards += [(op, tuple(map(attribute, op.uids))) for op in index.forwards[done:]]
        return self.forwards

    def received(self, ops: Sequence[Op], req: Request | None) -> None:
        """A user message booked as `req`: the forwards issued before it stay with the requests
        they ran for; the uid's later forwards are `req`'s (if it is served)."""
        self.update(ops)
        if req is not None and req.rejection is None and req.aborted_step is None:
            self.current[req.uid] = req


class _Prefix(Sequence[Op]):
    """The first `limit` ops of a list, as a list-like the checks scan."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.limit = 0

    def __len__(self) -> int:
        return self.limit

    @overload
    def __getitem__(self, index: int) -> Op: ...

    @overload
    def __getitem__(self, index: slice) -> list[Op]: ...

    def __getitem__(self, index: int | slice) -> Op | list[Op]:
        if isinstance(index, slice):
            return self.ops[slice(*index.indices(self.limit))]
        if index < 0:
            index += self.limit
        if not 0 <= index < self.limit:
            raise IndexError(index)
        return self.ops[index]


class TracePrefix:
    """A finished run's trace as it stood when a given event happened: what a check saw then."""

    def __init__(self, trace: Trace) -> None:
        self.ops = _Prefix(trace.ops)
        self.messages = trace.messages
        self.received = trace.received
        self.sizes = trace.sizes
        self.reuses = trace.reuses
        self.releases = trace.releases
        self.allocations = trace.allocations  # each with its `seq`: a check reads those before

    def at(self, num_ops: int) -> None:
        self.ops.limit = num_ops


class RunContext:
    """The run as invariants see it: configuration, device, trace, requests, current iteration."""

    def __init__(
        self,
        scenario: Scenario,
        device: Device,
        backend_name: str,
        scheduler: object,
        kv_shadow: KvShadow | None = None,
    ) -> None:
        self.scenario = scenario
        self.config = scenario.config
        self.device = device
        self.kv_shadow = kv_shadow  # what the device records of each KV cell, if it keeps one
        self.shapes = ShapeCache(scenario.config.max_seq_len)  # forwards' rows and lengths
        self.forwards = ForwardIndex()  # the trace's forwards, for the checks that read them
        self.attribution = Attribution(self.forwards)  # and the requests they ran for
        self.backend_name = backend_name
        self.vocabulary: dict[str, str] = {}  # the engine's words for ours (HasVocabulary)
        self.scheduler = scheduler
        self.ledger = RequestLedger(scenario.config)  # the requests as received and answered
        self.step = 0
        self.notices: list[str] = []
        self._books: Books | None = None  # this iteration's, read by several checks
        self._clocks: Clocks | None = None
        # After the run (checks deferred on a real device): the trace as it stood at the event
        # being replayed, that event's time, and whether the scheduler's books are current.
        self._view: TracePrefix | None = None
        # What the checks read: the device's trace, or the view. An attribute, not a property:
        # several checks read it at every message.
        self.trace: TraceView = device.trace
        self.frozen_now: float | None = None
        self.live_books = True
        self.ranks: list[RankLog] = []  # every rank of a run of several (core/ranks.py)
        # The findings the harness would drop if a check reported them again, by (invariant,
        # uids): those recorded already, where the run goes on after one (`Checks.repeats`).
        self.repeats: Container[tuple[str, tuple[int, ...]]] = frozenset()

    @property
    def scheduler(self) -> object:
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: object) -> None:
        self._scheduler = scheduler
        # Checked once; not by isinstance, which slows the scheduler (core/capability.py).
        self._with_books = cast(HasBooks, scheduler) if provides(scheduler, HasBooks) else None
        if provides(scheduler, HasVocabulary):  # kept once the run is over (deferred checks)
            self.vocabulary = dict(cast(HasVocabulary, scheduler).vocabulary())

    def term(self, word: str) -> str:
        """The engine's word for one of ours (`HasVocabulary`), or ours."""
        return self.vocabulary.get(word, word)

    def detach(self) -> None:
        """The run is over: forget the scheduler. It holds the harness, which holds this
        context: a cycle through the whole run (trace, checks, books) that only a full
        collection frees; without it the run is freed when its result is dropped."""
        self.scheduler = None
        self._books = None

    def scheduler_ran(self) -> None:
        """The scheduler may have changed its books (the harness calls this around `step()`)."""
        self._books = None

    @property
    def view(self) -> TracePrefix | None:
        return self._view

    @view.setter
    def view(self, view: TracePrefix | None) -> None:
        self._view = view
        self.trace = view if view is not None else self.device.trace

    @property
    def clocks(self) -> Clocks:
        """Vector clocks of the trace's ops, computed once for every check that needs them."""
        if self._clocks is None:
            self._clocks = Clocks(self.trace)
        return self._clocks

    def now(self) -> float:
        return self.frozen_now if self.frozen_now is not None else self.device.now()

    @property
    def has_books(self) -> bool:
        return self._with_books is not None

    def books(self) -> Books | None:
        """The scheduler's resource books, if it offers them (see `core/protocol.py`)."""
        if not self.live_books:
            return None  # replaying after the run: the books of that moment are gone
        if self._books is None and self._with_books is not None:
            self._books = self._with_books.books()
        return self._books
