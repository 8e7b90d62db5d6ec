"""Lifecycle points of a run's requests, observed as the run goes: when an anchored message is due.

An anchored message (`RequestSpec.arrival_after`, `abort_after`) waits for a lifecycle point of
a request (see `core.scenario.Anchor`). The points come from what any scheduler shows: its
forwards and output reads in the trace, its messages, and the aborts the workload sent. Each is
turned into the *moment* of the point: the first receive that can see it (the iteration after a
launch, a message or a read; for an abort, the receive that handed it over). The message is due
at the receive of `moment + iterations`, so an offset of 0 lands in the one-iteration window
between the point and whatever the scheduler defers to the next iteration (freeing a finished
request after its in-flight extra round, for one).

Only the requests that an anchor names are watched, and the trace is read incrementally: a
workload without anchors costs nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import UserMsg
from overlapcheck.core.rules import max_output
from overlapcheck.core.scenario import Anchor, RequestSpec
from overlapcheck.core.trace import Trace
from overlapcheck.invariants.forwards import context_ends


@dataclass(slots=True)
class _Life:
    """What has been seen of one watched request; each point as its moment (None: not yet)."""

    expected: int = 0  # sampling rounds it should take (max_output, or up to a scripted EOS)
    prompt_len: int = 0
    rounds: int = 0  # forwards launched that sample for it
    last_batch: int | None = None  # the latest forward that held it
    last_launch_step: int | None = None
    last_read: bool = True  # the host read that forward's output
    ended: int | None = None  # the moment it ended (finished, aborted or rejected)
    first_chunk: int | None = None
    last_launch: int | None = None
    finished: int | None = None
    extra_round: int | None = None
    abort: int | None = None
    will_abort: bool = False  # the workload sends it an abort (which an `abort` anchor waits for)


class LifecycleWatch:
    """The lifecycle points of the requests that anchors name, as the run reaches them.

    The source calls `sent`, `finished`, `rejected`, `aborted` as it hands over and observes
    messages, and `scan` before each receive (the ops issued since the last one). `moment` says
    when an anchor's point was seen.
    """

    def __init__(
        self, requests: tuple[RequestSpec, ...], config: SchedulerConfig, trace: Trace
    ) -> None:
        self.config = config
        self.trace = trace
        watched = {
            a.request for r in requests for a in (r.arrival_after, r.abort_after) if a is not None
        }
        self.requests = requests
        self.lives: dict[int, _Life] = {i: _Life() for i in sorted(watched)}
        for i, life in self.lives.items():
            r = requests[i]
            life.will_abort = any(
                x is not None for x in (r.abort_at, r.abort_iteration, r.abort_after)
            )
        self.owner: dict[int, int] = {}  # uid -> the index its forwards run for now
        self._seen = 0

    def __bool__(self) -> bool:
        return bool(self.lives)

    def moment(self, anchor: Anchor) -> int | None:
        life = self.lives[anchor.request]
        point = {
            "first-chunk": life.first_chunk,
            "last-launch": life.last_launch,
            "finished": life.finished,
            "extra-round": life.extra_round,
            "abort": life.abort,
        }[anchor.at]
        return point

    # -- what the source tells --------------------------------------------------------------

    def sent(self, index: int, msg: UserMsg) -> None:
        """Request `index` handed over and accepted by the workload's books (not a duplicate)."""
        self.scan()  # the forwards issued so far belong to the uid's earlier request
        self.owner[msg.uid] = index
        life = self.lives.get(index)
        if life is None:
            return
        spec = self.requests[index]
        expected = max_output(self.config, msg)
        eos = self.config.eos_token_id
        if not spec.ignore_eos and eos in spec.continuation:
            expected = min(expected, spec.continuation.index(eos) + 1)
        life.expected, life.prompt_len = expected, len(msg.input_ids)

    def finished(self, index: int, step: int) -> None:
        life = self.lives.get(index)
        if life is not None and life.ended is None:
            life.finished = step + 1
            self._end(life, step + 1)

    def rejected(self, index: int, step: int) -> None:
        life = self.lives.get(index)
        if life is not None and life.ended is None:
            self._end(life, step + 1)

    def aborted(self, index: int, step: int) -> None:
        """Request `index`'s abort handed over at the receive of iteration `step`."""
        life = self.lives.get(index)
        if life is not None and life.abort is None:
            life.abort = step
            if life.ended is None:
                self._end(life, step)

    def idle(self, step: int) -> None:
        """The scheduler idles at the receive of iteration `step` (nothing held, nothing in
        flight: it waits for an arrival): a request that ended has no cleanup deferred any more,
        so its `extra-round` is now where the trace showed no read of its last forward (a
        scheduler whose host reads outputs by a copy and a wait, not a `read_output` op)."""
        self.scan()
        for life in self.lives.values():
            if life.ended is not None and life.extra_round is None:
                life.extra_round = step

    def _end(self, life: _Life, moment: int) -> None:
        """The request ended: the points it can no longer reach fall back to this moment."""
        self.scan()
        life.ended = moment
        if life.last_launch is None:
            step = life.last_launch_step
            life.last_launch = moment if step is None else step + 1
        if life.last_read:  # nothing in flight: no cleanup is deferred
            life.extra_round = moment
        if life.first_chunk is None:
            life.first_chunk = moment
        if life.finished is None:
            life.finished = moment
        if life.abort is None and not life.will_abort:
            life.abort = moment

    # -- what the trace shows ---------------------------------------------------------------

    def scan(self) -> None:
        ops = self.trace.ops
        lives, owner = self.lives, self.owner
        width = self.config.max_seq_len
        for i in range(self._seen, len(ops)):
            op = ops[i]
            if op.kind == "forward":
                ends = None
                for pos, uid in enumerate(op.uids):
                    index = owner.get(uid)
                    life = lives.get(index) if index is not None else None
                    if life is None or (life.ended is not None and life.last_read):
                        continue
                    if life.first_chunk is None:
                        life.first_chunk = op.step + 1
                    life.last_batch, life.last_launch_step = op.batch, op.step
                    life.last_read = False
                    if life.last_launch is None:
                        ends = context_ends(op, width) if ends is None else ends
                        if pos < len(ends) and int(ends[pos]) >= life.prompt_len:
                            life.rounds += 1
                            if life.rounds >= life.expected:
                                life.last_launch = op.step + 1
            elif op.kind == "read_output":
                for life in lives.values():
                    if life.last_batch == op.batch and not life.last_read:
                        life.last_read = True
                        if life.ended is not None and life.extra_round is None:
                            life.extra_round = op.step + 1
        self._seen = len(ops)
