"""The scheduler-under-test protocol: what the harness needs from a scheduler, what it promises.

A scheduler under test is built by a *factory*::

    def make_scheduler(config: SchedulerConfig, device: Device, source: MessageSource,
                       sink: MessageSink) -> SchedulerUnderTest: ...

and driven by the harness one iteration at a time (`step()`), until it returns False.

What the harness gives it:

* `config`: pool sizes and switches. What binds a scheduler: the sizes, which are the device's
  (`num_slots`, `num_pages`, `page_size`, `max_seq_len`, `vocab_size`, `eos_token_id`): a batch
  or copy outside them is a `device-contract` finding. What it may ignore: every switch it does not
  have (`loop`, `cache`, `policy`, `faults`, `seed`, the policy thresholds, `preemption`,
  `page_alloc`, `preempt_style`) and `max_extend_tokens`, a scheduling budget (new tokens per
  forward, as vLLM's `max_num_batched_tokens`), not a device limit: any batch that fits the pools
  is accepted, and no check bounds a forward's size by it.
* `device`: the only way to the accelerator (see `core/device.py`); every call is traced.
* `source`: incoming `UserMsg` / `AbortMsg`. `poll(device.now())` returns what has arrived;
  `next_arrival()` says when the next one will (None: nothing more will come). An idle scheduler
  with nothing in flight sleeps until then rather than spinning (`wait_for_arrival`).
* `sink`: every output message (`TokenMsg`, `RejectMsg`) goes here, in the order the scheduler
  means it. The harness records and checks messages here, so nothing may bypass it.

What it promises:

* It touches the accelerator only through `device`; it reads sampled tokens only through
  `ForwardOutput.tokens()` after waiting on an event recorded after the forward.
* It rejects (with `RejectMsg`) exactly the requests `core.rules.rejection` rejects, and gives
  every other request at most `core.rules.max_output` tokens, `finished` on the last one. The
  rejection rule depends only on the request and the pool sizes, never on what else is running,
  so a scheduler that allocates pages on demand honours it as well as one that reserves them at
  admission: a request it accepts fits the device alone, so preempting the others serves it.
* The release rule: a slot (its `token_pool` and `page_table` rows) and KV pages go to another
  request only once every launched forward that used them for the old one is ordered before the
  new user's copies and forwards: the host waited on an event recorded after that forward
  (usually: the batch was processed), or the new user's copies are issued on the forward's own
  stream after it (stream order, vLLM's single-stream discipline). A finished or aborted request's
  extra round and a preempted request's in-flight round still use them. `slot-not-in-flight` and
  `no-race` judge this from happens-before, not from whether the host has waited.
* Preemption is allowed (recompute: resources given back, re-prefilled later from prompt + the
  tokens already sent; swap: KV copied to the host on the transfer stream and back). What a
  request was sent is judged, not how often its positions were computed: a position whose
  in-flight result was dropped (never sent) may be sampled again; a token is never sent twice.
* `step()` returns False only when it holds no work and `source.next_arrival()` is None.
* An exception it raises is a finding (`no-crash`), never swallowed. It may raise
  `core.errors.InvariantError(invariant, detail)` from its own consistency checks: that is
  reported as a violation of `invariant`.

Optional capability, `books()`: a snapshot of the scheduler's resource accounting (`Books`). The
checks that need it (`pages-conserved`, the books half of `slot-not-in-flight` and `liveness`) run
when it is there and are skipped with one notice when it is not; everything else is judged from
the trace, the footprints and the messages.

Optional, on the factory: `fit_scenario(scenario) -> Scenario`, the nearest workload the
scheduler can serve to a drawn one (an engine's older version with one page size only, or
without request cancellation, say). A search maps every drawn workload through it, so that it
never reports a workload the scheduler cannot take; given one it cannot serve, the factory (or
the adapter, at the request) raises UserError (one line). `ScenarioFitting` below. The
smallest pool a scheduler serves on has a declaration of its own (`serves_pools_from`); both are
applied by one path, `harness.scheduler_spec.SchedulerSpec.fit`, and a search shrinks only to
workloads it leaves unchanged.

Optional capability, `code_roots()`: folders whose imported modules are the scheduler's code even
where they are installed as a library (site-packages), such as an upstream engine an adapter
drives. A counterexample fingerprints every file of the scheduler's code (the modules it brought
in, outside the Python installation, third-party libraries and overlapcheck itself) so that a
replay can say which changed; these roots add the engine's files and name them relative to the
root (`python/minisgl/scheduler/scheduler.py`), with the checkout's git commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.messages import InMsg, OutMsg
from overlapcheck.core.scenario import Scenario


class MessageSource(Protocol):
    """Where requests come from: messages that have arrived by `now`, and when the next one will."""

    def poll(self, now: float) -> list[InMsg]: ...

    def next_arrival(self) -> float | None: ...


MessageSink = Callable[[OutMsg], None]


def wait_for_arrival(device: Device, source: MessageSource) -> bool:
    """An idle scheduler's wait (nothing held, nothing in flight): the host sleeps until the next
    message arrives. False when nothing more will ever come: the run is over. A source that
    watches lifecycles (`idling`) hears of it first: nothing is in flight any more."""
    idling = getattr(source, "idling", None)
    if idling is not None:
        idling()
    arrival = source.next_arrival()
    if arrival is None:
        return False
    device.sleep_until(max(arrival, device.now()))
    return True


@runtime_checkable
class SchedulerUnderTest(Protocol):
    """The one method the harness calls."""

    def step(self) -> bool:
        """One iteration of the scheduler's loop. False once idle with nothing more to come."""
        ...


SchedulerFactory = Callable[
    [SchedulerConfig, Device, MessageSource, MessageSink], SchedulerUnderTest
]

# The smallest KV pool, in tokens, a scheduler is meant to serve on under a configuration (its
# page size): below it the scheduler refuses or stalls by its own design (reserves it keeps
# beyond any request's pages, limits it derives from the pool), which a search need not draw.
PoolFloor = Callable[[SchedulerConfig], int]
_POOL_FLOOR = "overlapcheck_pool_floor"
SchedulerFactoryT = TypeVar("SchedulerFactoryT", bound=Callable[..., SchedulerUnderTest])


def serves_pools_from(floor: PoolFloor) -> Callable[[SchedulerFactoryT], SchedulerFactoryT]:
    """Declare on a factory the smallest pool its scheduler serves on (`PoolFloor`): generated
    scenarios and their shrinking keep at least that many pages (`pool_floor`)."""

    def declare(factory: SchedulerFactoryT) -> SchedulerFactoryT:
        vars(factory)[_POOL_FLOOR] = floor
        return factory

    return declare


def pool_floor(factory: object) -> PoolFloor | None:
    """What `serves_pools_from` declared on `factory` (None: any pool)."""
    floor = getattr(factory, _POOL_FLOOR, None)
    return floor if callable(floor) else None


class ScenarioFitting(Protocol):
    """The optional capability of a factory (see above): the nearest workload it serves."""

    def fit_scenario(self, scenario: Scenario) -> Scenario: ...


class Holding(NamedTuple):
    """What one live request holds: its slot (None while it waits for admission) and KV pages.

    `finished`: finished or aborted, its resources not all given back yet (a launched batch
    still holds it). `preempted`: taken off the running set and queued again (its uid is in
    `Books.pending`); it may still hold its slot and pages until the launched batch that holds it
    is processed (the release rule above), or hold nothing (recompute: re-prefilled when admitted
    again), or hold pages whose KV was copied to the host (swap: its `slot` is None while out).

    A NamedTuple: a scheduler builds one per live request at every step, and a frozen dataclass
    costs several times as much to build. `pages`: any immutable sequence of ints, as the books'
    page lists are (see `Books`).
    """

    uid: int
    slot: int | None
    pages: Sequence[int]
    finished: bool = False
    preempted: bool = False


class Books(NamedTuple):
    """A scheduler's resource accounting at one instant (between iterations).

    `live`: every request the scheduler still keeps anything for, pending ones included.
    `cached_pages` may overlap pages held by live requests (a shared prefix); `free_pages` must not.

    A NamedTuple, as `Holding` is: a scheduler builds one at every step.

    The page lists (these and `Holding.pages`) are any immutable `Sequence[int]`: tuples, or
    views that share storage with the scheduler's own lists (the reference hands out read-only
    int64 `memoryview`s, `reference/cache/snapshots.py`), provided a later change of those lists
    never changes a snapshot already handed out: the checks keep the last books' lists to judge
    the next ones against. The checks only iterate, index, slice and measure them, and compare
    them only with the same list's earlier snapshot (a comparison that fails, as a `memoryview`
    and a tuple's does, costs time, never a verdict).
    """

    live: tuple[Holding, ...]
    free_slots: tuple[int, ...]
    free_pages: Sequence[int]
    cached_pages: Sequence[int] = ()
    locked_pages: Sequence[int] = ()  # cached pages a live request's match pins (a subset)
    pending: tuple[int, ...] = ()  # uids waiting for admission, in queue order


class DerivedBooks(Books):
    """Books that also say which of their page lists were made from that list's snapshot in
    the books before: `free_from` the free list's, `held_from[i]` holding i's (that very object,
    compared by identity; the list itself where it is unchanged; None: a list made afresh). A
    list and the one it was made from agree on their common length (pages appended at its end,
    or its tail cut off), so a checker that holds the earlier snapshot judges only the pages
    that came or went, not the whole list again (thousands of pages, at every iteration).
    Optional: plain `Books` are as valid, only dearer to check.
    """

    # (class defaults: what `_replace` and `_make` give, which set no provenance)
    free_from: Sequence[int] | None = None
    held_from: tuple[Sequence[int] | None, ...] = ()


@runtime_checkable
class HasBooks(Protocol):
    """The optional capability: white-box checks read it between iterations."""

    def books(self) -> Books: ...


@runtime_checkable
class HasVocabulary(Protocol):
    """The optional capability: the engine's own words for overlapcheck's, so that findings
    speak its language. `vocabulary()` maps a term (`slot`, `page`, `request`) to the engine's
    (mini-sglang: `{"slot": "table_idx"}`); terms it leaves out keep overlapcheck's word. Asked
    once per run.

        class Mine:
            def vocabulary(self) -> Mapping[str, str]:
                return {"slot": "req_pool_idx"}
    """

    def vocabulary(self) -> Mapping[str, str]: ...


@runtime_checkable
class HasCodeRoots(Protocol):
    """The optional capability: the folders of the scheduler's code (see above)."""

    def code_roots(self) -> Sequence[Path]: ...
