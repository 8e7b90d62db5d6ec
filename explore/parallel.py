"""Search streams side by side: N worker processes (or Ray tasks, see `explore/ray_search.py`),
one driver.

Each stream is an ordinary `search()` with its own seed (`SearchSpec.stream`), all of them over
one Hypothesis example database. Streams talk to the driver in the messages of
`explore/stream_messages.py`.

The driver adds them up, hands the unshrunk counterexample and each smaller one to the caller at
once (they go to disk while shrinking goes on), stops the other streams on the first violation,
and reports a stream that died without saying `Done` in one line while the rest carry on. Ctrl-C
in the driver ends the search with the smallest failure it has heard of.
"""

from __future__ import annotations

import base64
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Any, Protocol

from overlapcheck.explore.coverage import measured
from overlapcheck.explore.search import (
    CUT_BUDGET,
    CUT_INTERRUPTED,
    Found,
    SearchInterrupted,
    SearchSpec,
    SearchStats,
    search,
)
from overlapcheck.explore.stream_messages import (
    Crashed,
    Done,
    Failed,
    Progress,
    Smaller,
    StreamMessage,
    Unshrunk,
)
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.revision import git_revision

Message = StreamMessage
NOBODY = -1  # no stream has found a violation yet
EVERYBODY = -2  # stop every stream (the budget ran out)


def available_cores() -> int:
    """The cores this process may run on (affinity and cgroup-pinned CPUs count, not the box's)."""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if count is not None:
        return int(count() or 1)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cex_of(found: Found, spec: SearchSpec) -> Counterexample:
    """A found violation as a counterexample (what crosses process lines)."""
    search = None
    if found.choices:  # what `explore --resume FILE` replays and shrinks from
        search = spec.to_json() | {"choices": base64.b64encode(found.choices).decode()}
    return Counterexample.of_run(
        found.result,
        spec.profile,
        found.draws,
        spec.skip,
        spec.extra_checks,
        spec.scheduler,
        git_revision(),
        search,
    )


def run_stream(
    spec: SearchSpec,
    index: int,
    report: Callable[[Message], None],
    claim: Callable[[], bool] = lambda: True,
    should_stop: Callable[[], bool] | None = None,
) -> Message:
    """One search stream: reports progress, the unshrunk failure (if `claim` says this stream is
    the first to find one), each smaller one while shrinking, and its end; returns the `Done`
    message too."""
    keep_freed_heap()  # a stream is many runs, in a worker process of its own

    def on_round(stats: SearchStats) -> None:
        report(Progress(index, stats.examples, stats.iterations))

    def on_failure(found: Found) -> bool:
        if not claim():
            return False
        report(Unshrunk(index, cex_of(found, spec)))
        return True

    def on_smaller(found: Found) -> None:
        report(Smaller(index, cex_of(found, spec)))

    result = search(spec, on_round, on_failure, should_stop, on_smaller)
    data = cex_of(result.found, spec) if result.found is not None else None
    stats = result.stats
    done = Done(index, stats.examples, stats.iterations, data, result.cut)
    report(done)
    return done


class Pool(Protocol):
    """The streams as the driver sees them, whatever runs them."""

    size: int

    def get(self, timeout: float) -> Message | None: ...

    def ended(self) -> list[tuple[int, str | None]]:
        """Streams found ended since the last call: (index, None) or (index, why it died)."""
        ...

    def stop(self, keep: int | None) -> None:
        """Stop every stream but `keep` (None: all of them)."""
        ...

    def close(self) -> None: ...


@dataclass
class Outcome:
    """What the streams found, added up."""

    stats: SearchStats
    found: Counterexample | None = None  # the shrunk counterexample
    unshrunk: Counterexample | None = None  # the first failing example, before shrinking
    best: Counterexample | None = None  # the smallest failure so far (the unshrunk one at first)
    cut: str | None = None  # CUT_INTERRUPTED or CUT_BUDGET: shrinking ended short; found = best
    interrupted: bool = False  # Ctrl-C ended the search (before or during shrinking)
    winner: int | None = None
    deaths: list[str] = field(default_factory=list)
    workers: int = 1
    bug: CheckerBug | None = None  # overlapcheck crashed in a worker: the input to save

    @property
    def counterexample(self) -> Counterexample | None:
        """What to save: the shrunk failure, else the smallest one so far (a cut or a death)."""
        return self.found or self.best


@dataclass
class Live:
    """The running totals a progress display shows."""

    examples: int
    iterations: int
    seconds: float
    alive: int
    workers: int


def _ignore(_: Any) -> None:
    pass


@dataclass(frozen=True)
class Listener:
    """What a search tells its caller as it happens; each hook does nothing unless given."""

    progress: Callable[[Live], None] = _ignore  # running totals, a few times a second
    unshrunk: Callable[[Counterexample], None] = _ignore  # the first failure, before shrinking
    smaller: Callable[[Counterexample], None] = _ignore  # each smaller failure while shrinking
    notice: Callable[[str], None] = _ignore  # a line for the user: a worker died, where Ray runs


QUIET = Listener()


class _Driver:
    def __init__(self, pool: Pool, spec: SearchSpec, listener: Listener) -> None:
        self.pool = pool
        self.spec = spec
        self.listener = listener
        self.examples = [0] * pool.size
        self.iterations = [0] * pool.size
        self.running = set(range(pool.size))
        self.errors: dict[int, str] = {}
        self.outcome = Outcome(SearchStats(), workers=pool.size)
        self.started = time.perf_counter()
        self.stopped_all = False

    def handle(self, msg: Message) -> None:
        index = msg.stream
        if isinstance(msg, Failed):
            self.errors[index] = msg.line
        elif isinstance(msg, Crashed):
            self.errors[index] = f"overlapcheck bug: {msg.line}"
            if self.outcome.bug is None:
                error = RuntimeError(f"{msg.line} (in search worker {index})\n{msg.traceback}")
                self.outcome.bug = CheckerBug(error, msg.scenario)
                self.outcome.bug.extra.update(msg.extra)
                self.pool.stop(keep=self.outcome.winner)
        elif isinstance(msg, Progress):
            self.examples[index], self.iterations[index] = msg.examples, msg.iterations
        elif isinstance(msg, Unshrunk):
            if self.outcome.winner is None:
                self.outcome.winner = index
                self.outcome.unshrunk = self.outcome.best = msg.cex
                stats = self.outcome.stats
                stats.first_failure = time.perf_counter() - self.started
                stats.examples_to_failure = sum(self.examples) + 1
                self.pool.stop(keep=index)
                self.listener.unshrunk(msg.cex)
        elif isinstance(msg, Smaller):
            if index == self.outcome.winner:
                self.outcome.best = msg.cex
                self.outcome.stats.smaller += 1
                self.listener.smaller(msg.cex)
        else:
            self.examples[index], self.iterations[index] = msg.examples, msg.iterations
            if index == self.outcome.winner and msg.cex is not None:
                self.outcome.found, self.outcome.cut = msg.cex, msg.cut
            elif msg.cex is not None and self.outcome.winner is None:  # no Unshrunk came first
                self.outcome.winner, self.outcome.found = index, msg.cex
                self.pool.stop(keep=index)

    def drain(self, timeout: float) -> None:
        msg = self.pool.get(timeout)
        while msg is not None:
            self.handle(msg)
            msg = self.pool.get(0.0)

    def run(self) -> Outcome:
        try:
            self._loop()
        except KeyboardInterrupt:
            self._interrupted()
        stats = self.outcome.stats
        stats.examples, stats.iterations = sum(self.examples), sum(self.iterations)
        stats.seconds = time.perf_counter() - self.started
        return self.outcome

    def _interrupted(self) -> None:
        """Ctrl-C: keep what has arrived (a smaller failure may be queued), then end. The
        caller closes the pool."""
        self.outcome.interrupted = True
        try:
            msg = self.pool.get(0.0)
            while msg is not None:
                self.handle(msg)
                msg = self.pool.get(0.0)
        except (KeyboardInterrupt, Exception):  # a second Ctrl-C, or the queue went with Ray
            pass
        if self.outcome.winner is not None and self.outcome.found is None:
            self.outcome.cut = CUT_INTERRUPTED

    def _loop(self) -> None:
        last_progress = 0.0
        while self.running:
            self.drain(0.1)
            for index, death in self.pool.ended():
                self.drain(0.2)  # its last messages may still be in flight
                self.running.discard(index)
                if index in self.errors:
                    death = self.errors[index]
                if death is not None:
                    line = (
                        f"worker {index} died ({death}) after {self.examples[index]} examples; "
                        f"{len(self.running)} of {self.pool.size} still running"
                    )
                    if index == self.outcome.winner and self.outcome.found is None:
                        line += "; its unshrunk counterexample is kept"
                    self.outcome.deaths.append(line)
                    self.listener.notice(line)
            elapsed = time.perf_counter() - self.started
            # A stream checks its budget between rounds; the driver stops them all a little later.
            if (
                not self.stopped_all
                and self.outcome.winner is None
                and elapsed > self.spec.budget + 2.0
            ):
                self.stopped_all = True
                self.pool.stop(keep=None)
            # The winner cuts its own shrink at the budget, after an example; one stuck in a
            # long example is stopped (it has reported its smallest failure so far).
            if (
                not self.stopped_all
                and self.outcome.winner is not None
                and (elapsed > self.spec.budget + 10.0)
            ):
                self.stopped_all = True
                self.pool.stop(keep=None)
            now = time.perf_counter()
            if now - last_progress > 0.25:
                last_progress = now
                self.listener.progress(self.live())
        if self.stopped_all and self.outcome.winner is not None and self.outcome.found is None:
            self.outcome.cut = CUT_BUDGET

    def live(self) -> Live:
        return Live(
            sum(self.examples),
            sum(self.iterations),
            time.perf_counter() - self.started,
            len(self.running),
            self.pool.size,
        )


def drive(pool: Pool, spec: SearchSpec, listener: Listener = QUIET) -> Outcome:
    try:
        return _Driver(pool, spec, listener).run()
    finally:
        pool.close()


# --- worker processes -------------------------------------------------------------------------


def _process_main(spec: SearchSpec, index: int, channel: Connection, winner: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle

    def claim() -> bool:
        with winner.get_lock():
            if winner.value == NOBODY:
                winner.value = index
            return bool(winner.value == index)

    def should_stop() -> bool:
        return winner.value not in (NOBODY, index)

    try:
        with measured(spec.coverage_files, spec.coverage_data):
            run_stream(spec, index, channel.send, claim, should_stop)
    except CheckerBug as bug:  # ours: the driver saves its input (the traceback is text now)
        channel.send(Crashed(index, bug.scenario, str(bug), bug.traceback_text(), bug.extra))
        raise SystemExit(1) from None
    except Exception as err:  # a bug of ours, or the scheduler's import: one line, not a trace
        channel.send(Failed(index, f"{type(err).__name__}: {err}"))
        raise SystemExit(1) from None


class ProcessPool:
    """Streams in worker processes (forkserver where there is one, else spawn: never a fork of a
    driver that may hold threads)."""

    GRACE = 5.0  # seconds a stopped stream gets to finish its example and say `Done`

    def __init__(self, spec: SearchSpec, workers: int) -> None:
        ctx: Any = mp.get_context(
            "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        )
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["overlapcheck.explore.parallel"])
        self.size = workers
        # A pipe per worker, not one shared queue: a worker killed while it writes (the OOM
        # killer, a SIGKILL) would die holding a shared queue's write lock, and every other
        # worker's next message would block forever. A pipe's half-written message only ends
        # that worker's own channel.
        pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
        self.receivers: list[Connection] = [receiver for receiver, _ in pipes]
        self.winner = ctx.Value("i", NOBODY)
        self.procs = [
            ctx.Process(
                target=_process_main,
                args=(spec.stream(i, workers), i, sender, self.winner),
                name=f"overlapcheck-worker-{i}",
                daemon=True,
            )
            for i, (_, sender) in enumerate(pipes)
        ]
        for proc in self.procs:
            proc.start()
        for _, sender in pipes:
            sender.close()  # the worker holds its end: its exit is the pipe's end of file
        self.pending: deque[Message] = deque()
        self.reported: set[int] = set()
        self.stop_at: float | None = None

    def get(self, timeout: float) -> Message | None:
        if not self.pending:
            open_ends = [r for r in self.receivers if not r.closed]
            if not open_ends:
                time.sleep(timeout)
                return None
            for ready in connection.wait(open_ends, timeout):
                assert isinstance(ready, Connection)
                try:
                    self.pending.append(ready.recv())
                except (EOFError, OSError, pickle.UnpicklingError):
                    ready.close()  # the worker ended (or died mid-message): nothing more comes
        return self.pending.popleft() if self.pending else None

    def ended(self) -> list[tuple[int, str | None]]:
        if self.stop_at is not None and time.perf_counter() > self.stop_at + self.GRACE:
            for proc in self.procs:  # stopped, yet still in an example after the grace period
                if proc.is_alive():
                    proc.terminate()
        out: list[tuple[int, str | None]] = []
        for i, proc in enumerate(self.procs):
            if i in self.reported or proc.is_alive():
                continue
            self.reported.add(i)
            code = proc.exitcode
            terminated_by_us = self.stop_at is not None and code == -signal.SIGTERM
            out.append((i, None if code == 0 or terminated_by_us else _exit_reason(code)))
        return out

    def stop(self, keep: int | None) -> None:
        with self.winner.get_lock():
            if keep is None and self.winner.value == NOBODY:
                self.winner.value = EVERYBODY
        if keep is None:
            self.stop_at = time.perf_counter()

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(timeout=5)
        for receiver in self.receivers:
            receiver.close()


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@contextmanager
def shared_database(spec: SearchSpec) -> Iterator[SearchSpec]:
    """The spec with a database directory every stream can open: `spec.database`, or a temporary
    one (removed afterwards) when none was given."""
    if spec.database is not None:
        yield spec
        return
    tmp = tempfile.mkdtemp(prefix="overlapcheck-db-")
    try:
        yield replace(spec, database=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def search_processes(spec: SearchSpec, workers: int, listener: Listener = QUIET) -> Outcome:
    """`workers` search streams in processes over one example database."""
    with shared_database(spec) as shared:
        pool = ProcessPool(shared, workers)
        return drive(pool, shared, listener)


def search_here(spec: SearchSpec, listener: Listener = QUIET) -> Outcome:
    """One stream in this process (`--workers 1`), reported like the parallel ones."""

    def on_round(stats: SearchStats) -> None:
        listener.progress(Live(stats.examples, stats.iterations, stats.seconds, 1, 1))

    outcome = Outcome(SearchStats())

    def on_failure(found: Found) -> bool:
        outcome.unshrunk = outcome.best = cex_of(found, spec)
        outcome.winner = 0
        listener.unshrunk(outcome.unshrunk)
        return True

    def on_smaller_found(found: Found) -> None:
        outcome.best = cex_of(found, spec)
        listener.smaller(outcome.best)

    try:
        with measured(spec.coverage_files, spec.coverage_data):
            result = search(spec, on_round, on_failure, on_smaller=on_smaller_found)
    except SearchInterrupted as stop:  # nothing found yet
        outcome.stats, outcome.interrupted = stop.stats, True
        return outcome
    outcome.stats, outcome.cut = result.stats, result.cut
    outcome.interrupted = result.cut == CUT_INTERRUPTED
    if result.found is not None:
        outcome.found, outcome.winner = cex_of(result.found, spec), 0
    return outcome


def search_streams(spec: SearchSpec, workers: int, listener: Listener = QUIET) -> Outcome:
    """`workers` streams: in this process for 1, else in worker processes."""
    if workers == 1:
        return search_here(spec, listener)
    return search_processes(spec, workers, listener)
