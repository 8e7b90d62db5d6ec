"""The scheduler-under-test protocol: what the harness needs from a scheduler, what it promises.

A scheduler under test is built by a *factory*::

    def make_scheduler(config: SchedulerConfig, device: Device, source: MessageSource,
                       sink: MessageSink) -> SchedulerUnderTest: ...

and driven by the harness one iteration at a time (`step()`), until it returns False.

What the harness gives it:

* `config`: pool sizes (slots, pages, page size, sequence length, vocabulary, EOS id) and switches
  (loop, cache, policy, faults). A scheduler may ignore switches it does not have; the sizes are
  the device's and bind it.
* `device`: the only way to the accelerator (see `core/device.py`); every call is traced.
* `source`: incoming `UserMsg` / `AbortMsg`. `poll(device.now())` returns what has arrived;
  `next_arrival()` says when the next one will (None: nothing more will come). An idle scheduler
  with nothing in flight calls `device.sleep_until(next_arrival())` rather than spinning.
* `sink`: every output message (`TokenMsg`, `RejectMsg`) goes here, in the order the scheduler
  means it. The harness records and checks messages here, so nothing may bypass it.

What it promises:

* It touches the accelerator only through `device`; it reads sampled tokens only through
  `ForwardOutput.tokens()` after waiting on an event recorded after the forward.
* It rejects (with `RejectMsg`) exactly the requests `core.rules.rejection` rejects, and gives
  every other request at most `core.rules.max_output` tokens, `finished` on the last one.
* `step()` returns False only when it holds no work and `source.next_arrival()` is None.
* An exception it raises is a finding (`no-crash`), never swallowed. It may raise
  `core.errors.InvariantError(invariant, detail)` from its own consistency checks: that is
  reported as a violation of `invariant`.

Optional capability, `books()`: a snapshot of the scheduler's resource accounting (`Books`). The
checks that need it (`pages-conserved`, the books half of `slot-not-in-flight` and `liveness`) run
when it is there and are skipped with one notice when it is not; everything else is judged from
the trace, the footprints and the messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.messages import InMsg, OutMsg


class MessageSource(Protocol):
    """Where requests come from: messages that have arrived by `now`, and when the next one will."""

    def poll(self, now: float) -> list[InMsg]: ...

    def next_arrival(self) -> float | None: ...


MessageSink = Callable[[OutMsg], None]


@runtime_checkable
class SchedulerUnderTest(Protocol):
    """The one method the harness calls."""

    def step(self) -> bool:
        """One iteration of the scheduler's loop. False once idle with nothing more to come."""
        ...


SchedulerFactory = Callable[
    [SchedulerConfig, Device, MessageSource, MessageSink], SchedulerUnderTest
]


@dataclass(frozen=True, slots=True)
class Holding:
    """What one live request holds: its slot (None while it waits for admission) and KV pages.

    `finished`: finished or aborted, its resources not all given back yet (a launched batch
    still holds it). `preempted`: taken off the running set and queued again (its uid is in
    `Books.pending`); it may still hold its slot and pages until the launched batch that holds it
    is processed (the release rule above), or hold nothing (recompute: re-prefilled when admitted
    again), or hold pages whose KV was copied to the host (swap: its `slot` is None while out).
    """

    uid: int
    slot: int | None
    pages: tuple[int, ...]
    finished: bool = False
    preempted: bool = False


@dataclass(frozen=True, slots=True)
class Books:
    """A scheduler's resource accounting at one instant (between iterations).

    `live`: every request the scheduler still keeps anything for, pending ones included.
    `cached_pages` may overlap pages held by live requests (a shared prefix); `free_pages` must not.
    """

    live: tuple[Holding, ...]
    free_slots: tuple[int, ...]
    free_pages: tuple[int, ...]
    cached_pages: tuple[int, ...] = ()
    locked_pages: tuple[int, ...] = ()  # cached pages a live request's match pins (a subset)
    pending: tuple[int, ...] = ()  # uids waiting for admission, in queue order


@runtime_checkable
class HasBooks(Protocol):
    """The optional capability: white-box checks read it between iterations."""

    def books(self) -> Books: ...
