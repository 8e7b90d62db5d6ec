"""Ranks in processes of their own: the driver side (the worker is `harness/rank_worker.py`).

Real TP ranks are processes, each with its own string-hash seed: a `set` of request-id strings
(vLLM's and SGLang's ids are strings) iterated into a batch is ordered one way on one rank and
another way on the next. In one process every rank would order it alike, so ranks 1..N-1 run in
worker processes, rank `r`'s started with `PYTHONHASHSEED` = (this process's, 0 when random) + r:
fixed, so the same inputs give the same traces in any process, and other than rank 0's whenever
this process's seed is fixed (the `overlapcheck` command pins its own to 0 when none is given:
`__main__.py`).

A worker lives as long as this process and serves every run of it (an upstream scheduler's import
is paid once per worker, not per example). Rank 0 stays here: it is the run the invariants judge.
Every iteration the driver hands each worker rank 0's receives and takes back its launches, its
decisions and whether it went on; a crash comes back as the scheduler's frames (`no-crash`,
naming the rank), a hang as the frames where it stood (`no-hang`). A worker that dies is one
line (UserError), never a hang.

A scheduler handed over as a Python object (`SchedulerSpec.of(factory)`) cannot be rebuilt in
another process: its ranks run in this one, with a notice. `OVERLAPCHECK_RANK_PROCESSES=0` runs
every rank in this process (faster; strings then hash alike on every rank).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import cast

from overlapcheck.backends.base import Backend
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import NoDelay, ReplayDelay, SplitsForRanks, Timing
from overlapcheck.core.capability import provides
from overlapcheck.core.errors import UserError, mark_program_error
from overlapcheck.core.ranks import RankLog
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.trace import Trace
from overlapcheck.harness.crash import CheckerBug, RankProcessDied, RemoteCrash
from overlapcheck.harness.rank_worker import (
    ASKED,
    NOMINAL,
    REPLAYED,
    SPLIT,
    Built,
    CostAsked,
    Costed,
    Crashed,
    End,
    Ended,
    Failed,
    Start,
    Step,
    Stepped,
    Stop,
    Stopped,
)
from overlapcheck.harness.ranks import Broadcast, rank_note
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.watchdog import DeadlineReached, RemoteHung, StepHung

ENV = "OVERLAPCHECK_RANK_PROCESSES"
POLL = 0.2  # seconds between looks at whether a silent worker still lives
STOP_WAIT = 5.0  # seconds a stopped step may take to unwind before its worker is killed


def in_this_process(under_test: SchedulerSpec, backend: Backend) -> str | None:
    """Why ranks 1.. run in this process (a notice; "" for none), or None: each in its own."""
    if os.environ.get(ENV, "1") == "0":
        return ""
    if under_test.given is not None:
        return (
            "ranks 1.. run in this process: the scheduler was handed over as a Python object, "
            "which another process cannot rebuild, so strings hash alike on every rank"
        )
    if type(backend) is not SimBackend:
        return f"ranks 1.. run in this process: the backend {type(backend).__name__} stays here"
    return None


def hash_seed(rank: int) -> int:
    """Rank `rank`'s `PYTHONHASHSEED`: this process's (0 when random) plus the rank."""
    mine = os.environ.get("PYTHONHASHSEED", "")
    base = int(mine) if mine.isdigit() else 0
    return (base + rank) % 2**32


class RankProcess:
    """One worker process, for rank `rank` of any run of this process."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        here, there = socket.socketpair()
        env = dict(os.environ, PYTHONHASHSEED=str(hash_seed(rank)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "overlapcheck.harness.rank_worker", str(there.fileno())],
            pass_fds=[there.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        there.close()
        self.conn = Connection(here.detach())
        self.torn = False  # an exception came while a message was half read: kill it
        self.owed = False  # the worker waits for a cost
        self.conn.send(list(sys.path))

    def send(self, request: object) -> None:
        self.torn = True
        try:
            self.conn.send(request)
        except OSError:
            self._died()
        self.torn = False

    def receive(self) -> object:
        """The worker's next reply; its death is one line, never a wait for ever."""
        while not self.conn.poll(POLL):
            if self.proc.poll() is not None:
                self._died()
        self.torn = True
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            self._died()
        self.torn = False
        return reply

    def _died(self) -> None:
        try:
            code = self.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:  # its socket closed, yet it lives on: end it
            self.proc.kill()
            code = self.proc.wait()
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        self.close()
        raise RankProcessDied(
            f"rank {self.rank}'s process (pid {self.proc.pid}) {how} in the middle of a run"
        )

    def stop(self) -> Stopped | None:
        """Stop the step it runs: where it stood, or None (it had returned, or was killed)."""
        if self.torn:
            self.close()
            return None
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline:
            try:
                if self.owed:
                    self.owed = False
                    self.conn.send(Stop())
                if self.proc.poll() is None:
                    os.kill(self.proc.pid, signal.SIGUSR1)
                if not self.conn.poll(POLL):
                    continue
                reply = self.conn.recv()
            except (StepHung, DeadlineReached):
                continue  # the watchdog's timer repeats while this unwinds
            except (EOFError, OSError):
                break
            if isinstance(reply, CostAsked):
                self.owed = True
            elif isinstance(reply, Stopped):
                return reply
            else:
                return None  # it got to the end of its step
        self.close()
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.conn.closed

    def close(self) -> None:
        """End the worker: its socket closed, it exits; killed if it does not."""
        if not self.conn.closed:
            self.conn.close()
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# One worker per rank number, for the life of this process: a run of several ranks borrows them,
# so that an expensive import (an upstream engine: 5-12 s) is paid once, not for every example.
_workers: dict[int, RankProcess] = {}


def worker(rank: int) -> RankProcess:
    found = _workers.get(rank)
    if found is None or not found.alive():
        found = _workers[rank] = RankProcess(rank)
    return found


@atexit.register
def close_workers() -> None:
    for process in _workers.values():
        process.close()
    _workers.clear()


def _forget_workers() -> None:
    """In a forked child: the workers are the parent's; let go of its sockets, nothing more."""
    for process in _workers.values():
        process.conn.close()
    _workers.clear()


os.register_at_fork(after_in_child=_forget_workers)


class RemoteRank:
    """A rank besides rank 0, stepped in its worker (`OtherRank`)."""

    def __init__(
        self, number: int, count: int, process: RankProcess, leader: Broadcast, timing: Timing
    ) -> None:
        self.number = number
        self.count = count
        self.process = process
        self.leader = leader
        self.timing = timing
        source = timing.source
        self.split = provides(source, SplitsForRanks)
        self.asked = not self.split and not isinstance(source, NoDelay | ReplayDelay)
        self.log = RankLog(number, [])
        self.ended = False
        self.sent = 0  # rank 0's receives handed over so far

    def start(self, spec: SchedulerSpec, scenario: Scenario) -> None:
        source = self.timing.source
        delays = (
            ASKED
            if self.asked
            else SPLIT
            if self.split
            else REPLAYED
            if isinstance(source, ReplayDelay)
            else NOMINAL
        )
        draws = source.draws if isinstance(source, ReplayDelay) else {}
        config = replace(scenario.config, rank=self.number)
        ranked = replace(scenario, config=config)
        start = Start(
            spec.text, ranked, self.count, self.timing.profile, delays, draws, list(sys.path)
        )
        self.process.send(start)
        reply = self._serve()
        if isinstance(reply, Failed):
            if reply.user:
                raise UserError(reply.text)
            raise CheckerBug(RuntimeError(f"rank {self.number}: {reply.text}"), scenario)
        assert isinstance(reply, Built), reply

    def run(self, step: int) -> None:
        receives = self.leader.receives
        upcoming = self.leader.next_arrival()
        source = cast(SplitsForRanks, self.timing.source).rank_source() if self.split else None
        self.process.send(Step(step, receives[self.sent :], upcoming, self.timing.sites, source))
        self.sent = len(receives)
        try:
            reply = self._serve()
        except StepHung:
            stopped = self.process.stop()
            if stopped is not None:
                raise RemoteHung(stopped.stack) from None
            raise
        except BaseException:
            self.process.stop()
            raise
        if isinstance(reply, Crashed):
            crash = RemoteCrash(reply.type_name, reply.text, reply.frames, reply.formatted)
            crash.add_note(rank_note(self.number, self.count))
            if reply.program:
                mark_program_error(crash)
            raise crash
        if isinstance(reply, Failed):
            raise UserError(reply.text)
        assert isinstance(reply, Stepped), reply
        if not self.asked:
            self.timing.sites = reply.site
            self.timing.draws.update(reply.draws)
        self.log.launches += reply.launches
        self.ended = not reply.went_on
        self.log.end(reply.went_on, reply.decisions)

    def _serve(self) -> object:
        """The worker's reply, once it has asked for every cost it needed."""
        while True:
            process = self.process
            reply = process.receive()
            if not isinstance(reply, CostAsked):
                return reply
            process.owed = True
            cost = self.timing.cost(reply.kind, reply.nominal)
            process.owed = False
            process.send(Costed(cost))

    def close(self) -> Trace:
        trace = Trace()
        trace.launches = self.log.launches
        if not self.process.alive():
            return trace
        self.process.send(End())
        ended = self.process.receive()
        assert isinstance(ended, Ended), ended
        trace.messages, trace.received = ended.messages, ended.received
        return trace


def start_others(
    count: int,
    under_test: SchedulerSpec,
    backend: SimBackend,
    scenario: Scenario,
    leader: Broadcast,
) -> list[RemoteRank]:
    """Ranks 1..count-1, each built in its worker, one after the other (a build may draw
    timing, which the ranks draw from one source in turn)."""
    ranks = []
    for number in range(1, count):
        rank = RemoteRank(number, count, worker(number), leader, backend.timing)
        rank.start(under_test, scenario)
        ranks.append(rank)
    return ranks
