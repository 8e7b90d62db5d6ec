"""The device seam: the only way the scheduler touches the accelerator.

The contract, for every backend:

* Two streams, `scheduler_stream` and `engine_stream`, and a third agent, `transfer_stream`, for
  KV copies between the device's KV pool and the host (`offload_kv` / `load_kv`: preemption by
  swap, the KV send of prefill/decode disaggregation). Work issued on a stream runs later, in issue
  order on that stream, asynchronously to the host and to the other streams. Nothing orders two
  streams except `wait_stream` and `wait_event`: in particular a KV copy is not ordered with the
  forwards that write or read those cells unless the scheduler orders it.
* The host only learns that stream work ran by waiting on an `Event` recorded after it
  (`Event.synchronize`). Reading device results without such a wait is a race.
* Every call records its footprint (who, which buffer cells, read or write, which synchronisation)
  into `trace`, so `no-race` and the timeline see the same operations on every backend.

Device buffers: `token_pool[num_slots + 1, max_seq_len]` (token ids; the last row is the dummy row),
`page_table[num_slots, max_seq_len]` (KV cell per position), the KV pool (`num_pages * page_size`
cells), the attention metadata (double-buffered by batch parity). Host buffers: the pinned staging
buffer for metadata, one pinned output buffer per forward.

With speculation on (`SchedulerConfig.draft_tokens` > 0) a decode step may emit several tokens per
sequence, and the host may launch a step whose positions depend on the previous step's results
through placeholders that the device resolves: `core/speculative.py` is that part of the contract
(`draft_pool`, `spec_out`, `resolve`, `ForwardOutput.emitted`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from overlapcheck.core.batch import BatchInput, RowWrite
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.trace import Trace

# Host phases whose cost is spent before the calls made inside them: building a batch; and for
# processing, the host's own overhead between a launch and the read of the previous results (so
# the simulator never predicts a read sooner than a real host can make it). A launch spends its cost
# after, since it enqueues as it goes. The simulator charges host time, and a GPU replay sleeps,
# at that point.
HOST_WORK_BEFORE_ISSUE: tuple[str, ...] = ("schedule", "process")


@dataclass(frozen=True, slots=True)
class Stream:
    """A device queue; `name` is its agent name in the trace."""

    name: str


@dataclass(frozen=True, slots=True)
class KvCopy:
    """KV cells copied to a pinned host buffer of their own by `offload_kv`: `length` cells, in
    the order given, for request `uid`. `buffer` names the host buffer in the trace."""

    id: int
    uid: int
    length: int

    @property
    def buffer(self) -> str:
        return f"host:kv{self.id}"


class Event(ABC):
    """A marker recorded on a stream; fires when the stream's work before it has run."""

    id: int

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until the event fired. Records a host-wait operation."""

    @abstractmethod
    def query(self) -> bool:
        """Whether the event fired already. Never blocks. A query costs host time like any host
        work (on the simulator 1 µs of simulated time, `backends/sim/device.QUERY_COST`), so a
        loop that polls until the event fires makes progress. One that returns True orders the
        host after the event's work, as `synchronize` does (recorded as a `host_query`)."""


class ForwardOutput(ABC):
    """The sampled tokens of one forward, in a pinned host buffer of its own."""

    batch: BatchInput

    @abstractmethod
    def tokens(self) -> list[int]:
        """Read the host buffer: one token per sequence of the batch.

        Valid only after the host waited on an event recorded after the forward on the engine
        stream; earlier, the values are whatever the buffer held (on the simulator: -1).
        Records a host read of the buffer.
        """

    def emitted(self) -> list[list[int]]:
        """Read the host buffer: each sequence's emitted tokens (one, or 1..drafts+1 for a verify
        sequence, see `core/speculative.py`). The same validity rule as `tokens()`; records the
        same host read."""
        return [[t] for t in self.tokens()]


class Device(ABC):
    """An accelerator with three streams (scheduler, engine, transfer), as the scheduler sees
    it. Each method's docstring is the contract; docs/contract.md's device table names them all
    (a test keeps the two equal)."""

    trace: Trace
    scheduler_stream: Stream
    engine_stream: Stream
    transfer_stream: Stream
    # Whether the program's own tensors live on it (the simulated CUDA runs a scheduler's torch
    # code on a simulator device): memory held in whatever reference cycles the program's objects
    # make, so the run's end leaves them young (harness/runner.py, `_fewer_collections`).
    holds_program_tensors: bool = False

    @abstractmethod
    def now(self) -> float:
        """Host time in seconds since the run started (simulated on the simulator)."""

    @abstractmethod
    def set_step(self, step: int) -> None:
        """Tell the device which scheduler iteration issues the next calls (for the trace)."""

    @abstractmethod
    def span(self, phase: str, work: int = 0) -> AbstractContextManager[None]:
        """A host phase (`schedule`, `process`, ...). `work` scales its simulated CPU cost.

        Calls made inside are attributed to the phase in the trace.
        """

    @abstractmethod
    def sleep_until(self, time: float) -> None:
        """The host idles until `time` (waiting for the next request to arrive)."""

    @abstractmethod
    def copy_to_device(self, buffer: str, writes: Sequence[RowWrite], stream: Stream) -> None:
        """H2D of host values into rows of `token_pool` or `page_table`, run later on `stream`.

        The host values are captured at the call (a fresh pinned buffer per call), so the caller
        may reuse its lists at once. The device cells are written when the copy runs.
        """

    @abstractmethod
    def stage_metadata(self, batch: BatchInput, stream: Stream) -> Event:
        """Write `batch.metadata(fields)` (5 fields a sequence, 8 with speculation on) into the
        reusable pinned staging buffer now, and enqueue its H2D into the metadata slot of the
        batch's parity on `stream`.

        The staging buffer is one buffer: the caller must wait on the returned event before the
        next call, or that call overwrites values the previous copy has not read yet.
        """

    @abstractmethod
    def wait_stream(self, waiter: Stream, waitee: Stream) -> None:
        """Work issued on `waiter` from now on runs after all work issued on `waitee` so far."""

    @abstractmethod
    def record(self, stream: Stream) -> Event:
        """An event that fires when the work issued on `stream` so far has run."""

    @abstractmethod
    def wait_event(self, stream: Stream, event: Event) -> None:
        """Work issued on `stream` from now on runs after `event` fired."""

    def released(self, resource: str, ids: Sequence[int]) -> None:  # noqa: B027
        """Optional, for findings only: the scheduler gives back `ids` of `resource` (`"slot"`,
        `"page"`) here. The device notes the caller's line (`Trace.releases`), so that a
        lifecycle finding names where the resource was freed, not only where it was reused. It
        issues and orders nothing, and a scheduler that never calls it is judged the same."""

    def close(self) -> None:  # noqa: B027 (most devices hold nothing to let go of)
        """The run is over: let go of what would keep its objects in reference cycles (the
        harness calls it once the scheduler is idle; the clock and the trace still read)."""

    def resolve(self, batch: BatchInput, stream: Stream) -> None:
        """Enqueue on `stream` the resolution of `batch`'s placeholders: read, for each sequence
        with a `source`, what the previous batch's forward wrote into `spec_out` for that source,
        and write the resolved shift into the metadata slot of `batch`'s parity. It must run after
        that forward and after `batch`'s metadata copy, and before `batch`'s forward; nothing here
        waits (see `core/speculative.py`). A device without speculation refuses."""
        raise InvariantError(
            "device-contract", f"this device cannot resolve placeholders (batch {batch.label})"
        )

    @abstractmethod
    def forward(self, batch: BatchInput, stream: Stream) -> ForwardOutput:
        """Enqueue the model on `stream`: gather input ids from `token_pool`, read the metadata
        slot of the batch's parity, attend over the paged KV, write the new KV, sample, write each
        sample into `token_pool[out_row, out_col]`, then copy the samples into a fresh pinned host
        buffer (D2H on the same stream). Nothing here waits; the caller orders it.
        """

    @abstractmethod
    def offload_kv(self, uid: int, cells: Sequence[int], stream: Stream) -> KvCopy:
        """Enqueue on `stream` a D2H of the KV cells `cells` (every layer's K and V, in order)
        into a fresh pinned host buffer, for request `uid`.

        The copy reads the cells when it runs: the caller orders it after the forwards that write
        them (`wait_stream(stream, engine_stream)`), and gives the cells to another request only
        once the copy ran (a wait on an event recorded after it, by the host or by the stream of
        the next writer). Reading the copy's values is `load_kv`'s business only.
        """

    @abstractmethod
    def load_kv(self, saved: KvCopy, cells: Sequence[int], stream: Stream) -> None:
        """Enqueue on `stream` a H2D of `saved` into the KV cells `cells` (as many as saved), run
        later. The caller orders it after the copy that filled `saved` and after the last users
        of `cells`, and orders the forwards that read `cells` after it (an event recorded after
        it, waited on by their stream).
        """
