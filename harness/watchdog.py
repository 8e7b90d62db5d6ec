"""A wall-clock watchdog on the scheduler's `step()`: a step that does not return within the
hang timeout is a finding (`no-hang`), and a search's deadline ends a run wherever it stands.

Simulated time moves only through device calls, so a scheduler that loops without calling the
device (or blocks on something that is not the device) would stop the run for good. In the main
thread the watchdog is a `SIGALRM` timer armed around each step: a signal also interrupts a
blocking call (`time.sleep`, a lock), and its handler receives the very frame that was running.
In another thread a monitor thread raises the exception into the stepping thread
(`PyThreadState_SetAsyncExc`), which interrupts Python code but not a blocking C call. The
exceptions are BaseExceptions, so that a scheduler's `except Exception` does not swallow them;
the timer repeats, so that a scheduler's bare `except:` does not either.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# How often the timer fires again after its first shot, while the step has not returned.
REPEAT = 0.2


class StepHung(BaseException):
    """Raised into a step() that ran past the hang timeout."""


class RemoteHung(StepHung):
    """A step that hung in another process (a rank of its own, `harness/rank_processes.py`),
    with the frames where it stood there, outermost first."""

    def __init__(self, stack: traceback.StackSummary) -> None:
        super().__init__("a rank's step did not return")
        self.stack = stack


class DeadlineReached(KeyboardInterrupt):
    """Raised into a step() running when a search's wall-clock deadline passed: not a finding.

    A KeyboardInterrupt because Hypothesis lets one through untouched (it neither records the
    example nor saves it), as it lets Ctrl-C."""


def _quiet_when_lost() -> None:
    """Once a process: an exception of the watchdog's that lands in a finalizer (a weakref
    callback the collector ran inside the step) is lost there, and Python would print it with a
    traceback. Lost is fine (the timer raises it again `REPEAT` seconds later, into the step);
    the traceback is not: it is not the scheduler's nor a bug of ours."""
    hook = sys.unraisablehook
    if getattr(hook, "overlapcheck_watchdog", False):
        return

    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, (StepHung, DeadlineReached)):
            hook(unraisable)

    quiet.overlapcheck_watchdog = True  # type: ignore[attr-defined]
    sys.unraisablehook = quiet


class Watchdog:
    """Times each step against `timeout` seconds (None: no limit) and a `deadline` on the
    `time.monotonic()` clock (None: none). `stack` holds the frames of the step that hung,
    outermost first, once one did."""

    def __init__(self, timeout: float | None, deadline: float | None = None) -> None:
        self.timeout = timeout if timeout else None
        self.deadline = deadline
        self.stack: traceback.StackSummary | None = None
        self._inside = False
        self._started = 0.0
        self._thread: threading.Thread | None = None
        self._stepper = threading.get_ident()
        self._done = threading.Event()
        self._main = threading.current_thread() is threading.main_thread()
        self._old_handler: Any = None
        self._old_timer = (0.0, 0.0)
        self.began: tuple[int, int, int, float] = (0, 0, 0, 0.0)
        # The deadline was raised into a step: an exception of the scheduler's own that comes
        # out of that step may be it, converted (SGLang's Rust tree core: a panic).
        self.deadline_raised = False

    @property
    def active(self) -> bool:
        return self.timeout is not None or self.deadline is not None

    @property
    def hung(self) -> bool:
        return self.stack is not None

    def __enter__(self) -> Watchdog:
        if not self.active:
            return self
        _quiet_when_lost()
        if self._main:
            self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._old_timer = signal.setitimer(signal.ITIMER_REAL, 0)
        else:
            self._thread = threading.Thread(target=self._monitor, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        self._inside = False
        if self._main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)
            if self._old_timer[0] > 0:  # someone else's timer: give it back what was left
                signal.setitimer(signal.ITIMER_REAL, *self._old_timer)
        else:
            self._done.set()
            if self._thread is not None:
                self._thread.join()

    @contextmanager
    def step(self, began: tuple[int, int, int, float]) -> Iterator[None]:
        """Around one `step()` call; `began` (the trace's operations, messages sent and
        received, and the simulated time) is kept for a step that hangs."""
        self.began = began
        if not self.active:
            yield
            return
        self._started = time.monotonic()
        limit = self._limit()
        if limit <= 0:
            raise DeadlineReached
        self._inside = True
        if self._main:
            signal.setitimer(signal.ITIMER_REAL, limit, REPEAT)
        try:
            yield
        finally:
            self._inside = False
            if self._main:
                signal.setitimer(signal.ITIMER_REAL, 0)

    def _limit(self) -> float:
        """Seconds the running step may still take: to the hang timeout or the deadline."""
        now = time.monotonic()
        limits = []
        if self.timeout is not None:
            limits.append(self._started + self.timeout - now)
        if self.deadline is not None:
            limits.append(self.deadline - now)
        return min(limits)

    def _verdict(self, frame: FrameType | None) -> type[BaseException] | None:
        """What to raise into the step now: nothing while it still has time."""
        if not self._inside or self._limit() > 0:
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline and not self.hung:
            self.deadline_raised = True
            return DeadlineReached
        if self.stack is None:
            self.stack = traceback.extract_stack(frame)
        return StepHung

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        raised = self._verdict(frame)
        if raised is not None:
            raise raised

    def _monitor(self) -> None:
        while not self._done.wait(min(REPEAT, self.timeout or REPEAT)):
            frame = sys._current_frames().get(self._stepper)
            raised = self._verdict(frame)
            if raised is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._stepper), ctypes.py_object(raised)
                )
