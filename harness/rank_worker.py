"""A rank in a process of its own: the worker (`python -m overlapcheck.harness.rank_worker FD`).

The driver (`harness/rank_processes.py`) starts one such process per rank besides rank 0, each
with its own `PYTHONHASHSEED`, and keeps it for every run of its process (an upstream import is
paid once). Over one socket, strictly request and reply (the driver's `Request`s, the worker's
`Reply`s):

- `Start`: build the scheduler for one run (the spec by its text, the scenario with this rank's
  `config.rank`, a simulated device of its own); reply `Built` or `Failed`.
- `Step`: one iteration, with rank 0's receives since the last and when the workload's next
  message arrives; reply `Stepped` (whether it went on, the forwards it launched, its decisions)
  or `Crashed` (the scheduler's exception, as text and frames). While it steps, a timed operation
  asks the driver for its cost (`CostAsked` / `Costed`) when the delays come from a source only the
  driver can draw (Hypothesis's, a seeded generator): the ranks draw from one source in turn,
  as in one process, so rank 0's trace is the same as there.
- `End`: let go of the run; reply `Ended` with this rank's messages and receives.

The driver stops a step (its hang timeout or deadline, an error of its own) with `SIGUSR1`, or
with `Stop` in place of a cost: the step unwinds with the frames where it stood (`Stopped`).
The worker never raises while it reads or writes the socket, so a message is never torn. It
exits when the driver's end of the socket closes.
"""

from __future__ import annotations

import ctypes
import gc
import pickle
import signal
import socket
import sys
import traceback
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Cost, DelaySource, Profile, ReplayDelay, Timing
from overlapcheck.core.errors import DeviceFault, UserError, program_error
from overlapcheck.core.messages import InMsg, OutMsg
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.trace import Launch, Message
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.ranks import Follower, _padding, decisions_of, rank_note, record_reply
from overlapcheck.harness.scheduler_spec import parse_spec

# How the worker's device gets its delays: none (nominal), replayed by site, from a source the
# driver hands each step (`SplitsForRanks`: all three drawn here, from the site the driver
# says), or asked of the driver for each timed operation.
NOMINAL, REPLAYED, SPLIT, ASKED = "nominal", "replayed", "split", "asked"


# --- what the driver sends --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    spec: str
    scenario: Scenario  # with this rank's `config.rank`
    count: int  # ranks in the run
    profile: Profile
    delays: str  # NOMINAL, REPLAYED, SPLIT or ASKED
    draws: dict[int, float] = field(default_factory=dict)  # REPLAYED: the recorded ones
    paths: list[str] = field(default_factory=list)  # the driver's sys.path now


@dataclass(frozen=True, slots=True)
class Step:
    step: int
    receives: list[tuple[int, float, list[InMsg]]]  # rank 0's since the last Step
    upcoming: float | None  # when the workload's next message arrives
    site: int  # the shared timing's next site (but ASKED)
    source: DelaySource | None = None  # SPLIT: this step's


@dataclass(frozen=True, slots=True)
class Costed:
    cost: Cost


class Stop:
    """In place of a cost: the driver stops the step."""


class End:
    """The run is over."""


# --- what the worker sends --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Built:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    user: bool  # UserError (the user's factory): else a bug of ours, with the traceback
    text: str


@dataclass(frozen=True, slots=True)
class CostAsked:
    kind: str
    nominal: float


@dataclass(frozen=True, slots=True)
class Stepped:
    went_on: bool
    launches: list[Launch]
    decisions: Mapping[str, object] | None
    site: int
    draws: dict[int, float]


@dataclass(frozen=True, slots=True)
class Crashed:
    type_name: str
    text: str  # the exception's message
    frames: traceback.StackSummary
    formatted: str  # the whole traceback, for a bug of ours
    # the program's own error on its way out through overlapcheck's frames (`program_error`,
    # a `DeviceFault`): the driver marks it so, as an exception here would be
    program: bool = False


@dataclass(frozen=True, slots=True)
class Stopped:
    stack: traceback.StackSummary  # where the step stood, outermost first


@dataclass(frozen=True, slots=True)
class Ended:
    messages: list[Message]
    received: list[Message]


class Interrupted(BaseException):
    """Raised into a step the driver stops (a BaseException: `except Exception` lets it by)."""

    def __init__(self, stack: traceback.StackSummary) -> None:
        super().__init__("stopped by the driver")
        self.stack = stack


class DriverGone(BaseException):
    """The driver's end of the socket closed: end without a word."""


class Worker:
    """The worker's state: its socket, and the run it holds (if any)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.stepping = False  # inside a step, outside the socket: SIGUSR1 may raise
        self.run: Run | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stepping:
            self.stepping = False
            raise Interrupted(traceback.extract_stack(frame))

    def send(self, reply: object) -> None:
        try:
            self.conn.send(reply)
        except OSError as err:
            raise DriverGone from err

    def ask(self, kind: str, nominal: float) -> Cost:
        """A timed operation's cost, drawn by the driver."""
        self.stepping = False
        self.send(CostAsked(kind, nominal))
        try:
            answer = self.conn.recv()
        except (EOFError, OSError) as err:
            raise DriverGone from err
        if isinstance(answer, Stop):
            raise Interrupted(traceback.extract_stack(sys._getframe(1)))
        self.stepping = True
        assert isinstance(answer, Costed)
        return answer.cost

    def serve(self) -> None:
        with suppress(DriverGone):  # nobody to answer: end quietly
            self._serve()

    def _serve(self) -> None:
        while True:
            try:
                request = self.conn.recv()
            except (EOFError, OSError):
                return  # the driver went away
            if isinstance(request, Start):
                self.send(self.start(request))
            elif isinstance(request, Step):
                self.send(self.step(request))
            elif isinstance(request, End):
                self.send(self.end())
            elif not isinstance(request, Costed | Stop):  # left over from a stopped step
                raise TypeError(f"rank worker: unexpected request {request!r}")

    def start(self, request: Start) -> object:
        self.run = None
        _follow(request.paths)
        try:
            self.run = Run(self, request)
        except UserError as err:
            return Failed(True, str(err))
        except CheckerBug as err:
            return Failed(False, err.traceback_text())
        except Exception:
            return Failed(False, traceback.format_exc())
        return Built()

    def step(self, request: Step) -> object:
        run = self.run
        assert run is not None, "a step before the run was built"
        run.receives += request.receives
        run.upcoming = request.upcoming
        run.step_no = request.step
        run.timing.sites = request.site
        if request.source is not None:
            run.timing.source = request.source
        run.timing.draws = {}
        run.device.set_step(request.step)
        pad = _padding(run.number)
        mark = len(run.launches)
        self.stepping = True
        try:
            went_on = run.scheduler.step()
            self.stepping = False
            decisions = run.decided()
        except DriverGone:
            raise
        except Interrupted as stop:
            self.stepping = False
            self.run = None
            return Stopped(stop.stack)
        except Exception as err:
            self.stepping = False
            self.run = None
            err.add_note(rank_note(run.number, run.count))
            text = str(err).splitlines()[0] if str(err) else ""
            frames = traceback.extract_tb(err.__traceback__)
            program = program_error(err) or isinstance(err, DeviceFault)
            return Crashed(type(err).__name__, text, frames, traceback.format_exc(), program)
        finally:
            self.stepping = False
        del pad
        reply = Stepped(
            went_on, run.launches[mark:], decisions, run.timing.sites, dict(run.timing.draws)
        )
        try:
            pickle.dumps(decisions)
        except Exception as err:
            self.run = None
            return Failed(
                True,
                f"rank {run.number}'s decisions() returned a value that cannot be sent between "
                f"processes ({type(err).__name__}: {err}); return plain values (bool, int, str, "
                "tuples of them)",
            )
        return reply

    def end(self) -> object:
        run, self.run = self.run, None
        if run is None:
            return Ended([], [])
        trace = run.device.trace
        run.device.close()
        return Ended(trace.messages, trace.received)


class AskedTiming(Timing):
    """Timing whose every cost the driver draws (`Worker.ask`)."""

    worker: Worker

    def cost(self, kind: str, nominal: float) -> Cost:
        return self.worker.ask(kind, nominal)


class Run:
    """One run's rank: its scheduler on a device of its own, fed rank 0's receives."""

    def __init__(self, worker: Worker, request: Start) -> None:
        scenario, self.count = request.scenario, request.count
        self.number = scenario.config.rank
        if request.delays == ASKED:
            asked = AskedTiming(request.profile)
            asked.worker = worker
            self.timing: Timing = asked
        elif request.delays == REPLAYED:
            self.timing = Timing(request.profile, ReplayDelay(request.draws))
        else:
            self.timing = Timing(request.profile)
        self.device = SimBackend(self.timing).make_device(scenario)
        self.launches: list[Launch] = []
        self.device.trace.launches = self.launches
        self.receives: list[tuple[int, float, list[InMsg]]] = []
        self.upcoming: float | None = None
        self.step_no = 0
        source = Follower(self.receives, lambda: self.upcoming, self.device.trace, self._step)
        pad = _padding(self.number)
        spec = parse_spec(request.spec)
        self.scheduler: Any = spec.build(scenario.config, self.device, source, self.sink, scenario)
        del pad
        self.decided = decisions_of(self.scheduler)

    def _step(self) -> int:
        return self.step_no

    def sink(self, msg: OutMsg) -> None:
        record_reply(self.device.trace, msg, self.device.now(), self.step_no)


def _follow(paths: list[str]) -> None:
    """What the driver can import, this process can (a test's folder, a scheduler's): its
    `sys.path` first, as it stands at each run."""
    if sys.path[: len(paths)] != paths:
        sys.path[:] = paths + [p for p in sys.path if p not in paths]


def _die_with_the_driver() -> None:
    """On Linux, a worker stuck in a step that never calls the device would outlive a driver
    that was killed: the kernel ends it with its parent."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the socket's end still ends a worker that waits


PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    conn = Connection(sock.detach())
    _follow(conn.recv())
    gc.set_threshold(50_000, 10, 10)  # as the driver's runs do (`harness/runner.py`)
    keep_freed_heap()  # a worker is many runs
    _die_with_the_driver()
    worker = Worker(conn)
    signal.signal(signal.SIGUSR1, worker.on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    worker.serve()


if __name__ == "__main__":
    # the package's module, not this `__main__` copy: the driver's requests unpickle as its classes
    from overlapcheck.harness.rank_worker import main as package_main

    package_main(sys.argv[1:])
