"""Several ranks of one scheduler, run side by side in lockstep (`num_ranks > 1`, `--ranks N`).

Each rank is the scheduler built again by the same factory, with its own objects, its own
`config.rank` and its own simulated device (its own buffers, streams, trace and clock: a rank's
GPU holds its own KV shard). Rank 0 is the run the invariants judge; it receives the workload's
messages, and every other rank is handed the same messages in the same iteration and at the same
receive of it (`Follower`), as SGLang's TP ranks get what rank 0 received (`broadcast_pyobj`).
Every iteration runs on every rank before the next begins, rank 0 first; the ranks draw their
latencies from the backend's one timing source in turn, so each operation of each rank draws its
own (ranks jitter independently, as real hosts and GPUs do; under nominal timing their clocks
stay equal). `rank-consistent` then compares what each rank launched and decided
(`core/ranks.py`).

Ranks 1.. run in processes of their own where their scheduler can be rebuilt there
(`harness/rank_processes.py`: each with its own string-hash seed, as real ranks' processes);
otherwise here (`Rank`, `build_others`). Either way, objects hashed by identity (a `set` of
request objects) are ordered by their addresses, which differ between ranks; before each rank's
step a rank-specific number of small blocks of every allocator size class is taken (`_padding`),
so that the rank's new objects do not land at the same offsets as the rank before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from overlapcheck.backends.base import Backend
from overlapcheck.backends.sim.timing import SplitsForRanks
from overlapcheck.core.capability import provides
from overlapcheck.core.messages import InMsg, OutMsg, TokenMsg, UserMsg
from overlapcheck.core.protocol import SchedulerUnderTest
from overlapcheck.core.ranks import HasDecisions, RankLog
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.trace import Message, Trace
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.stepping import Workload


class Broadcast:
    """Rank 0's message source: the workload's, with each receive also kept for the other ranks
    (its iteration, time and messages, in order)."""

    def __init__(self, inner: Workload, step: Callable[[], int]) -> None:
        self.inner = inner
        self.step = step
        self.receives: list[tuple[int, float, list[InMsg]]] = []

    def poll(self, now: float) -> list[InMsg]:
        msgs = self.inner.poll(now)
        self.receives.append((self.step(), now, msgs))
        return msgs

    def next_arrival(self) -> float | None:
        return self.inner.next_arrival()

    def idling(self) -> None:
        idling = getattr(self.inner, "idling", None)
        if idling is not None:
            idling()

    def observe(self, msg: OutMsg, now: float) -> None:
        self.inner.observe(msg, now)


class Follower:
    """Another rank's message source: its k-th receive of an iteration hands over what rank 0's
    k-th receive of that iteration got (with whatever earlier receives of rank 0 it did not
    match: it diverged); when it waits, it waits for the time of that receive of rank 0's.

    `receives` is rank 0's (`Broadcast.receives`, or a copy kept up to date by a rank in a
    process of its own); `upcoming` is when the workload's next message arrives."""

    def __init__(
        self,
        receives: list[tuple[int, float, list[InMsg]]],
        upcoming: Callable[[], float | None],
        trace: Trace,
        step: Callable[[], int],
    ) -> None:
        self.receives = receives
        self.upcoming = upcoming
        self.trace = trace
        self.step = step
        self.next = 0  # rank 0's receives handed over so far

    def poll(self, now: float) -> list[InMsg]:
        step, receives = self.step(), self.receives
        out: list[InMsg] = []
        while self.next < len(receives) and receives[self.next][0] < step:
            out += receives[self.next][2]
            self.next += 1
        if self.next < len(receives) and receives[self.next][0] == step:
            out += receives[self.next][2]
            self.next += 1
        for msg in out:
            kind = "user" if isinstance(msg, UserMsg) else "abort"
            self.trace.received.append(Message(now, step, msg.uid, kind))
        return out

    def next_arrival(self) -> float | None:
        receives = self.receives
        if self.next < len(receives) and receives[self.next][0] <= self.step():
            return receives[self.next][1]
        return self.upcoming()


class OtherRank(Protocol):
    """A rank besides rank 0, as the lockstep steps it: in this process (`Rank`) or in one of
    its own (`harness/rank_processes.py`)."""

    number: int
    log: RankLog
    ended: bool

    def run(self, step: int) -> None:
        """Its iteration `step`: begun in its log already; ends it there (whether it went on,
        its decisions) and sets `ended` when it has nothing more to do."""

    def close(self) -> Trace:
        """The run is over: let go of its scheduler and device; its trace (its messages and
        receives at least)."""
        ...


class Rank:
    """One rank besides rank 0 in this process: its scheduler, device and log."""

    def __init__(self, number: int, count: int, device: Any, log: RankLog) -> None:
        self.number = number
        self.count = count
        self.device = device
        self.log = log
        self.scheduler: SchedulerUnderTest | None = None
        self.decided: Callable[[], Mapping[str, object] | None] = lambda: None
        self.ended = False

    def sink(self, msg: OutMsg) -> None:
        """Its replies are recorded in its own trace; rank 0's are the ones judged."""
        record_reply(self.device.trace, msg, self.device.now(), len(self.log.more))

    def run(self, step: int) -> None:
        self.device.set_step(step)
        timing = self.device.timing
        shared = timing.source
        if provides(shared, SplitsForRanks):  # as a rank in a process of its own draws
            timing.source = cast(SplitsForRanks, shared).rank_source()
        pad = _padding(self.number)
        assert self.scheduler is not None
        try:
            went_on = self.scheduler.step()
        except Exception as err:
            err.add_note(rank_note(self.number, self.count))
            raise
        finally:
            timing.source = shared
        del pad
        self.ended = not went_on
        self.log.end(went_on, self.decided())

    def close(self) -> Trace:
        self.scheduler = None
        self.device.close()
        return cast(Trace, self.device.trace)


def rank_note(number: int, count: int) -> str:
    """What a rank's exception carries, and what `no-crash` then names (`harness/crash.py`)."""
    return f"(on rank {number} of {count})"


def record_reply(trace: Trace, msg: OutMsg, now: float, step: int) -> None:
    """A reply of a rank besides rank 0, kept in its own trace."""
    if isinstance(msg, TokenMsg):
        record = Message(now, step, msg.uid, "token", msg.token, msg.finished)
    else:
        record = Message(now, step, msg.uid, "reject", reason=msg.reason)
    trace.messages.append(record)


def decisions_of(scheduler: object) -> Callable[[], Mapping[str, object] | None]:
    """How to read a scheduler's decisions after each iteration (None: it declares none)."""
    if provides(scheduler, HasDecisions):
        return lambda: dict(cast(HasDecisions, scheduler).decisions())
    return lambda: None


class Lockstep:
    """What the harness steps for a run of several ranks: one iteration of every rank per
    `step()`, rank 0 first; its result is rank 0's (a rank that disagrees is `rank-consistent`'s
    finding, not the loop's)."""

    def __init__(
        self,
        lead: SchedulerUnderTest,
        lead_log: RankLog,
        others: Sequence[OtherRank],
        step: Callable[[], int],
    ) -> None:
        self.lead = lead
        self.lead_log = lead_log
        self.lead_decisions = decisions_of(lead)
        self.others = others
        self.step_no = step

    def step(self) -> bool:
        log = self.lead_log
        log.begin()
        more = self.lead.step()
        log.end(more, self.lead_decisions())
        step = self.step_no()
        for rank in self.others:
            rank.log.begin()
            if rank.ended:
                rank.log.end(False, None)
                continue
            rank.run(step)
        return more


# bytes objects of these lengths fill one block of each of CPython's small-object size classes
# (16-byte steps up to 512 bytes; a bytes object takes 33 bytes plus its length).
_PAD_LENGTHS = tuple(range(15, 512 - 33 + 1, 16))


def _padding(rank: int) -> list[bytes]:
    """`rank` fresh blocks of every small size class, held while the rank steps: the rank's new
    objects then sit `rank` blocks further on than they would, in every class, so a set of them
    is not ordered as the same objects of the rank before it by chance of the allocator."""
    return [bytes(n) for n in _PAD_LENGTHS for _ in range(rank)]


def build_others(
    count: int,
    under_test: SchedulerSpec,
    backend: Backend,
    scenario: Scenario,
    leader: Broadcast,
    step: Callable[[], int],
) -> list[Rank]:
    """Ranks 1..count-1 in this process, each built as rank 0 was, on a device of its own."""
    ranks = []
    for number in range(1, count):
        config = replace(scenario.config, rank=number)
        device = backend.make_device(replace(scenario, config=config))
        device.trace.launches = []
        rank = Rank(number, count, device, RankLog(number, device.trace.launches))
        source = Follower(leader.receives, leader.next_arrival, device.trace, step)
        pad = _padding(number)
        rank.scheduler = under_test.build(config, device, source, rank.sink, scenario)
        del pad
        rank.decided = decisions_of(rank.scheduler)
        ranks.append(rank)
    return ranks
