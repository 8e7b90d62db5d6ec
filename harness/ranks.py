"""Several ranks of one scheduler, run side by side in lockstep (`num_ranks > 1`, `--ranks N`).

Each rank is the scheduler built again by the same factory, with its own objects, its own
`config.rank` and its own simulated device (its own buffers, streams, trace and clock: a rank's
GPU holds its own KV shard). Rank 0 is the run the invariants judge; it receives the workload's
messages, and every other rank is handed the same messages in the same iteration and at the same
receive of it (`Follower`), as SGLang's TP ranks get what rank 0 received (`broadcast_pyobj`).
Every iteration runs on every rank before the next begins, rank 0 first; the ranks share the
backend's timing source, so each operation of each rank draws its own latency (ranks jitter
independently, as real hosts and GPUs do; under nominal timing their clocks stay equal).
`rank-consistent` then compares what each rank launched and decided (`core/ranks.py`).

All ranks live in one process, so objects hashed by identity (a `set` of request objects) are
ordered by their addresses, which differ between ranks; before each rank's step a rank-specific
number of small blocks of every allocator size class is taken (`_padding`), so that the rank's
new objects do not land at the same offsets as the rank before it. Strings hash alike in every
rank of one process: see docs/ranks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from overlapcheck.backends.base import Backend
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

    def observe(self, msg: OutMsg, now: float) -> None:
        self.inner.observe(msg, now)


class Follower:
    """Another rank's message source: its k-th receive of an iteration hands over what rank 0's
    k-th receive of that iteration got (with whatever earlier receives of rank 0 it did not
    match: it diverged); when it waits, it waits for the time of that receive of rank 0's."""

    def __init__(self, leader: Broadcast, trace: Trace, step: Callable[[], int]) -> None:
        self.leader = leader
        self.trace = trace
        self.step = step
        self.next = 0  # rank 0's receives handed over so far

    def poll(self, now: float) -> list[InMsg]:
        step, receives = self.step(), self.leader.receives
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
        receives = self.leader.receives
        if self.next < len(receives) and receives[self.next][0] <= self.step():
            return receives[self.next][1]
        return self.leader.next_arrival()


class Rank:
    """One rank besides rank 0: its scheduler, device and log."""

    def __init__(self, number: int, device: Any, log: RankLog) -> None:
        self.number = number
        self.device = device
        self.log = log
        self.scheduler: SchedulerUnderTest | None = None
        self.ended = False

    def sink(self, msg: OutMsg) -> None:
        """Its replies are recorded in its own trace; rank 0's are the ones judged."""
        now, step = self.device.now(), self.log_step()
        if isinstance(msg, TokenMsg):
            record = Message(now, step, msg.uid, "token", msg.token, msg.finished)
        else:
            record = Message(now, step, msg.uid, "reject", reason=msg.reason)
        self.device.trace.messages.append(record)

    def log_step(self) -> int:
        return len(self.log.more)


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
        others: list[Rank],
        step: Callable[[], int],
    ) -> None:
        self.lead = lead
        self.lead_log = lead_log
        self.lead_decisions = decisions_of(lead)
        self.others = others
        self.step_no = step
        self.decisions = [decisions_of(r.scheduler) for r in others]

    def step(self) -> bool:
        log = self.lead_log
        log.begin()
        more = self.lead.step()
        log.end(more, self.lead_decisions())
        step = self.step_no()
        for rank, decided in zip(self.others, self.decisions, strict=True):
            rank.log.begin()
            if rank.ended:
                rank.log.end(False, None)
                continue
            rank.device.set_step(step)
            pad = _padding(rank.number)
            assert rank.scheduler is not None
            try:
                went_on = rank.scheduler.step()
            except Exception as err:
                err.add_note(f"(on rank {rank.number} of {len(self.others) + 1})")
                raise
            del pad
            rank.ended = not went_on
            rank.log.end(went_on, decided())
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
    """Ranks 1..count-1, each built as rank 0 was, on a device of its own."""
    ranks = []
    for number in range(1, count):
        config = replace(scenario.config, rank=number)
        device = backend.make_device(replace(scenario, config=config))
        device.trace.launches = []
        rank = Rank(number, device, RankLog(number, device.trace.launches))
        source = Follower(leader, device.trace, step)
        pad = _padding(number)
        rank.scheduler = under_test.build(config, device, source, rank.sink, scenario)
        del pad
        ranks.append(rank)
    return ranks
