"""Turn a workload into the scheduler's message source.

Messages are delivered by simulated time (`arrival`, `abort_at`), at the receive of a scheduler
iteration (`arrival_iteration`, `abort_iteration`; the harness binds the iteration count), at a
lifecycle point of a request (`arrival_after`, `abort_after`: see `scenarios/anchors.py`), or,
for a follow-up turn (`after`), `think` seconds after the earlier request ended, with a prompt
built from the tokens the scheduler actually sent for it (the harness calls `observe` for every
reply).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import (
    AbortMsg,
    InMsg,
    OutMsg,
    RejectMsg,
    TokenMsg,
)
from overlapcheck.core.scenario import Anchor, RequestSpec, user_msg
from overlapcheck.core.trace import Trace
from overlapcheck.scenarios.anchors import LifecycleWatch

USER, ABORT = 0, 1
Delivery = tuple[int, int | None, int]  # (iteration, request index or None for an abort, uid)


@dataclass(slots=True)
class _Event:
    kind: int  # USER or ABORT
    index: int  # the request's position in the workload
    time: float | None  # None: keyed to an iteration, or (a follow-up) to an earlier request's end
    iteration: int | None
    anchor: Anchor | None = None


class WorkloadSource:
    """Requests and aborts of a workload, each delivered once its moment has come and what it
    waits for has happened (its request sent, for an abort; the earlier request with the same
    uid sent; the earlier turn ended, for a follow-up). Among the messages due at one receive:
    by time (iteration-keyed ones first), a request before an abort, then by workload order.

    `deliveries` ((iteration, uid, kind) as another run received them) replaces every moment and
    wait: messages go out at those iterations in that order (a replay on another backend). The
    k-th request message for a uid is the k-th request with that uid in the workload.

    Anchored messages need `config` and the run's `trace` (where the lifecycle points are seen).
    """

    def __init__(
        self,
        requests: tuple[RequestSpec, ...],
        deliveries: list[tuple[int, int, str]] | None = None,
        config: SchedulerConfig | None = None,
        trace: Trace | None = None,
        step: Callable[[], int] = lambda: 0,
    ) -> None:
        self.requests = requests
        anchored = any(r.arrival_after or r.abort_after for r in requests)
        if anchored and deliveries is None and (config is None or trace is None):
            raise ValueError("anchored messages need the run's config and trace")
        self._watch = (
            LifecycleWatch(requests, config, trace)
            if anchored and config is not None and trace is not None and deliveries is None
            else None
        )
        self._step = step  # the harness's count of scheduler iterations
        n = len(requests)
        self.prompts: list[tuple[int, ...] | None] = [None] * n  # as sent
        self.got: list[list[int]] = [[] for _ in range(n)]  # tokens the scheduler sent for each
        self.ended: list[float | None] = [None] * n
        self._live: dict[int, int] = {}  # uid -> index of its accepted, unended request
        self._dups: dict[int, list[int]] = {}  # uid -> requests sent while it was live
        self._previous: list[int | None] = []  # the earlier request with the same uid
        last: dict[int, int] = {}
        for i, spec in enumerate(requests):
            self._previous.append(last.get(spec.uid))
            last[spec.uid] = i
        self._replay = None if deliveries is None else delivery_schedule(requests, deliveries)
        self._pending: list[_Event] = []
        for i, spec in enumerate(requests):
            self._pending.append(
                _Event(
                    USER,
                    i,
                    spec.arrival if spec.timed else None,
                    spec.arrival_iteration,
                    spec.arrival_after,
                )
            )
            if spec.abort_after is not None:
                self._pending.append(_Event(ABORT, i, None, None, spec.abort_after))
            elif spec.abort_iteration is not None:
                self._pending.append(_Event(ABORT, i, None, spec.abort_iteration))
            elif spec.abort_at is not None:
                at = max(spec.abort_at, spec.arrival) if spec.timed else spec.abort_at
                self._pending.append(_Event(ABORT, i, at, None))

    # -- the MessageSource protocol -----------------------------------------------------------

    def poll(self, now: float) -> list[InMsg]:
        if self._replay is not None:
            return self._poll_replay(now)
        out: list[InMsg] = []
        step = self._step()
        if self._watch is not None:
            self._watch.scan()
        while True:
            due = [e for e in self._pending if self._waits_done(e) and self._due(e, now, step)]
            if not due:
                return out
            event = min(due, key=self._order)
            self._pending.remove(event)
            out.append(self._deliver(event.kind, event.index, self.requests[event.index].uid, now))

    def next_arrival(self) -> float | None:
        if self._replay is not None:
            # Idle iterations are how a replay reaches the iteration of the next message.
            return 0.0 if self._replay else None
        times = [self._time(e) for e in self._pending if self._waits_done(e)]
        return min(times, default=None)

    def idling(self) -> None:
        """The scheduler idles (`core.protocol.wait_for_arrival`): see `LifecycleWatch.idle`."""
        if self._watch is not None and self._replay is None:
            self._watch.idle(self._step())

    def observe(self, msg: OutMsg, now: float) -> None:
        """A message the scheduler sent: what a follow-up turn will be built from."""
        if isinstance(msg, RejectMsg):
            owed = self._dups.get(msg.uid)
            index = owed.pop(0) if owed else self._live.pop(msg.uid, None)
            if index is not None:
                self._end(index, now)
                if self._watch is not None:
                    self._watch.rejected(index, self._step())
        elif isinstance(msg, TokenMsg):
            index = self._live.get(msg.uid)
            if index is None:
                return  # a message after the request ended: it is not part of the conversation
            self.got[index].append(msg.token)
            if msg.finished:
                del self._live[msg.uid]
                self._end(index, now)
                if self._watch is not None:
                    self._watch.finished(index, self._step())

    # -- internals ----------------------------------------------------------------------------

    def _waits_done(self, e: _Event) -> bool:
        if e.anchor is not None and self.prompts[e.anchor.request] is None:
            # No point of a request not sent yet is reached: until it is sent, the message has
            # no moment, and idle iterations (`_time`'s 0.0) must not stand in for that request's
            # own arrival time (an idle host would poll until the liveness bound instead).
            return False
        if e.kind == ABORT:
            return self.prompts[e.index] is not None
        previous = self._previous[e.index]
        if previous is not None and self.prompts[previous] is None:
            return False
        after = self.requests[e.index].after
        return after is None or self.ended[after] is not None

    def _time(self, e: _Event) -> float:
        """When `e` is due (0.0 for an iteration or an anchor: idle iterations reach it); its
        waits done."""
        if e.iteration is not None or e.anchor is not None:
            return 0.0
        if e.time is not None:
            return e.time
        spec = self.requests[e.index]
        assert spec.after is not None
        ended = self.ended[spec.after]
        assert ended is not None
        return ended + spec.think

    def _due(self, e: _Event, now: float, step: int) -> bool:
        if e.anchor is not None:
            assert self._watch is not None
            moment = self._watch.moment(e.anchor)
            return moment is not None and moment + e.anchor.iterations <= step
        return e.iteration <= step if e.iteration is not None else self._time(e) <= now

    def _order(self, e: _Event) -> tuple[float, int, int]:
        keyed = e.iteration is not None or e.anchor is not None
        return (-1.0 if keyed else self._time(e), e.kind, e.index)

    def _deliver(self, kind: int, index: int, uid: int, now: float) -> InMsg:
        if kind == ABORT:
            live = self._live.pop(uid, None)
            if live is not None:
                self._end(live, now)
            if self._watch is not None:
                self._watch.aborted(index, self._step())
                if live is not None and live != index:
                    self._watch.aborted(live, self._step())
            return AbortMsg(uid)
        spec = self.requests[index]
        prompt = spec.prompt
        if spec.after is not None:
            earlier = self.prompts[spec.after] or self.requests[spec.after].prompt
            prompt = earlier + tuple(self.got[spec.after]) + spec.prompt
        self.prompts[index] = prompt
        msg = user_msg(spec, prompt)
        if uid in self._live:
            self._dups.setdefault(uid, []).append(index)  # the scheduler must reject it
        else:
            self._live[uid] = index
            if self._watch is not None:
                self._watch.sent(index, msg)
        return msg

    def _end(self, index: int, now: float) -> None:
        if self.ended[index] is None:
            self.ended[index] = now

    def _poll_replay(self, now: float) -> list[InMsg]:
        assert self._replay is not None
        out: list[InMsg] = []
        step = self._step()
        while self._replay and self._replay[0][0] <= step:
            _, index, uid = self._replay.pop(0)
            out.append(self._deliver(USER if index is not None else ABORT, index or 0, uid, now))
        return out


class IterationSource:
    """Given messages delivered at given scheduler iterations (a hand-written schedule)."""

    def __init__(self, schedule: list[tuple[int, InMsg]], step: Callable[[], int]) -> None:
        """`step` reads the current iteration (the scheduler's `step_no`)."""
        self._schedule = sorted(schedule, key=lambda item: item[0])
        self._next = 0
        self._step = step

    def poll(self, now: float) -> list[InMsg]:
        out = []
        while self._next < len(self._schedule) and self._schedule[self._next][0] <= self._step():
            out.append(self._schedule[self._next][1])
            self._next += 1
        return out

    def next_arrival(self) -> float | None:
        # Idle iterations are how a replay reaches the iteration of the next message.
        return 0.0 if self._next < len(self._schedule) else None


def delivery_schedule(
    requests: tuple[RequestSpec, ...], received: list[tuple[int, int, str]]
) -> list[Delivery]:
    """Each (iteration, uid, kind) a run received, as (iteration, request index, uid): the k-th
    request message for a uid is the workload's k-th request with that uid (None for an abort)."""
    by_uid: dict[int, list[int]] = {}
    for i, spec in enumerate(requests):
        by_uid.setdefault(spec.uid, []).append(i)
    used: dict[int, int] = {}
    out: list[Delivery] = []
    for step, uid, kind in received:
        if kind != "user":
            out.append((step, None, uid))
            continue
        k = used.get(uid, 0)
        used[uid] = k + 1
        candidates = by_uid.get(uid, [])
        if k >= len(candidates):
            raise ValueError(f"the deliveries send uid {uid} more often than the workload does")
        out.append((step, candidates[k], uid))
    return sorted(out, key=lambda d: d[0])  # stable: the received order within an iteration
