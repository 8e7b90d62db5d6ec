"""The optional base class of an adapter's scheduler under test.

It holds what the harness hands every scheduler (config, device, source, sink), the loaded
engine, the front end, and the polling every `step()` does: take the messages that have arrived;
with nothing held and nothing arrived, sleep the host until the next arrival; and say when the run
is over. Subclasses supply `step()` (one iteration of the engine's own loop) and `books()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from overlapcheck.adapters.base.checkout import Loaded
from overlapcheck.adapters.base.front import FrontEnd
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.messages import AbortMsg, UserMsg
from overlapcheck.core.protocol import Books, MessageSink, MessageSource, wait_for_arrival


class UpstreamScheduler(ABC):
    """An upstream engine's scheduler, one iteration of its loop per `step()`.

    class VllmScheduler(UpstreamScheduler):
        def step(self) -> bool:
            msgs = self.receive(holding=bool(self.engine.has_requests()))
            if msgs is None:
                return False
            ...   # map msgs, run one iteration, send tokens through self.front
            return True
    """

    def __init__(
        self,
        config: SchedulerConfig,
        device: Device,
        source: MessageSource,
        sink: MessageSink,
        loaded: Loaded,
    ) -> None:
        self.config = config
        self.device = device
        self.source = source
        self.sink = sink
        self.loaded = loaded
        self.front = FrontEnd(config, sink)

    def receive(
        self, holding: bool, on_idle: Callable[[], None] | None = None
    ) -> list[UserMsg | AbortMsg] | None:
        """The messages that have arrived by now. With nothing `holding` (no request held, no
        batch in flight) and nothing arrived, the engine's idle work runs (`on_idle`), then the
        host sleeps until the next arrival and polls again, which may still give nothing (a
        message due later comes in a later step). None: nothing is held and nothing more will
        come, so the run is over."""
        device, source = self.device, self.source
        msgs = source.poll(device.now())
        if holding or msgs:
            return msgs
        if not self.wait_for_arrival(on_idle):
            return None
        return source.poll(device.now())

    def wait_for_arrival(self, on_idle: Callable[[], None] | None = None) -> bool:
        """Idle: the engine's idle work runs (`on_idle`), then the host sleeps until the next
        arrival. False when nothing more will ever come."""
        if on_idle is not None:
            on_idle()
        return wait_for_arrival(self.device, self.source)

    def code_roots(self) -> tuple[Path, ...]:
        """The engine's package folder: the code a counterexample fingerprints, so that a replay
        after the user's fix says which of the engine's files changed."""
        return self.loaded.code_roots()

    @abstractmethod
    def step(self) -> bool:
        """One iteration of the engine's loop; False once idle with nothing more to come."""

    @abstractmethod
    def books(self) -> Books:
        """Which slot and pages each live request holds, read off the engine's own managers."""
