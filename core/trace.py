"""The run's trace: every operation the host issued, with its footprint and its synchronisation.

Both backends record the same trace through the :class:`~overlapcheck.core.device.Device` seam, so
the race checker, the invariants and the timeline work on either. Operations are appended in the
order the host issues them; that order is a linearisation of happens-before (every edge: stream
order, host issue, event record -> wait, points from an earlier issue to a later one), which is
what lets the race checker run online.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from overlapcheck.core.sites import Site

HOST = "host"
Mode = Literal["r", "w"]

# Buffers the footprints name. Host-side pinned buffers are prefixed "host:".
TOKEN_POOL = "token_pool"
PAGE_TABLE = "page_table"
KV = "kv"
METADATA = "metadata"
STAGING = "host:staging"
# Op kinds of the transfer stream's KV copies (`Device.offload_kv`, `Device.load_kv`).
KV_OFFLOAD = "kv_offload"
KV_LOAD = "kv_load"
DRAFT_POOL = "draft_pool"  # speculation: drafts per slot (core/speculative.py)
SPEC_OUT = "spec_out"  # speculation: tokens each verify sequence emitted, per batch parity


def host_output_buffer(batch_id: int) -> str:
    """The pinned host buffer that receives one batch's sampled tokens."""
    return f"host:out{batch_id}"


class Move(NamedTuple):
    """`dst[dst_cells[i]] = src[src_cells[i]]` for every i (flat cell indices)."""

    src: str
    src_cells: np.ndarray
    dst: str
    dst_cells: np.ndarray


@dataclass(slots=True)
class Access:
    """A read or write of a set of cells of one buffer (flat indices; may repeat)."""

    buffer: str
    cells: np.ndarray
    mode: Mode

    def describe(self) -> str:
        n = len(self.cells)
        span = f"{int(self.cells.min())}..{int(self.cells.max())}" if n else "-"
        return f"{'write' if self.mode == 'w' else 'read'} {self.buffer}[{span}] ({n} cells)"


@dataclass(slots=True)
class Op:
    """One traced operation.

    `agent` is `host` or a stream name. Host operations run at issue time; stream operations run
    later, when the backend executes them, which fills `start` and `end`.
    """

    seq: int
    agent: str
    kind: str
    step: int
    phase: str
    issue: float
    label: str = ""
    batch: int | None = None
    uids: tuple[int, ...] = ()
    accesses: list[Access] = field(default_factory=list)
    records: int | None = None  # event id this op records
    waits: int | None = None  # event id this op waits for
    start: float | None = None
    end: float | None = None
    delay: float = 0.0  # injected on top of the nominal duration (simulator timing draws)
    work: int = 0  # host phases: the requests they touched (what their cost scales with)
    # A forward's rows (slots) and context ends per sequence, as the recorder knew them (the
    # checks read them at every forward; a trace read from a file derives them from the
    # page-table read instead). Not part of the digest: the accesses already say it.
    shape: tuple[np.ndarray, np.ndarray] | None = None
    # A forward's draft positions per sequence, where the recorder knows them: the last that
    # many positions of each context end are drafts being verified, not inputs (`work-bound`
    # judges an input's position; a scheduler may verify a full set of drafts by design). Not
    # part of the digest, like `shape`.
    drafts: np.ndarray | None = None
    # Where the scheduler's own code made the call (`core/sites.py`), for findings: not part of
    # the digest (a run's trace is the same wherever its code lives).
    site: Site | None = None
    # A data-moving kernel's element-wise copies (a gather, a copy, a clone): which cell of
    # which buffer each written cell took its value from, as the backend knew it (the
    # simulated CUDA), for `no-uninit-read` to follow never-written values through. Not part
    # of the digest (the accesses say which cells; this, which went where).
    moves: tuple[Move, ...] = ()

    @property
    def done(self) -> bool:
        return self.end is not None

    def identity(self) -> dict[str, object]:
        """What names the operation in a report or a trace file (not its timing or footprint)."""
        return {
            "seq": self.seq,
            "agent": self.agent,
            "kind": self.kind,
            "step": self.step,
            "phase": self.phase,
            "label": self.label,
            "batch": self.batch,
            "uids": list(self.uids),
        }


@dataclass(slots=True)
class Message:
    """A message the scheduler sent or received, with when and at which iteration."""

    time: float
    step: int
    uid: int
    kind: str  # sent: "token" or "reject"; received: "user" or "abort"
    token: int = -1
    finished: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Verified:
    """What one verify sequence emitted, as the device computed it (`core/speculative.py`): a
    record for tools (a replay reproduces acceptance from it), neither judged nor in the digest."""

    batch: int
    index: int  # the sequence's index in its batch
    uid: int
    first: int  # the row position of its first draft (start + resolved shift + 1); -1: unknown
    drafts: int
    emitted: int

    @property
    def accepted(self) -> int:
        return self.emitted - 1


@dataclass(frozen=True, slots=True)
class Reuse:
    """Memory the program freed and a caching allocator handed to a new tensor `buffer`. Either
    the trace names both tensors' cells by one buffer (`source` None), or the old tensor was
    `source`, of another dtype or place, and cells [a, b) of `buffer` (`cells`) are the memory
    of cells [c, d) of `source` (`source_cells`), each cell of the shorter range the same bytes
    as an equal share of the longer: the race checker carries their accesses over
    (`invariants/races.py`). Also a record for findings (which line freed it, which reused it);
    not in the digest."""

    buffer: str
    at: int  # the ops issued before the reuse (the next op's seq)
    stream: str  # the stream of the allocation that got the block
    freed: Site | None
    freed_step: int
    reused: Site | None
    reused_step: int
    source: str | None = None
    cells: tuple[int, int] = (0, 0)
    source_cells: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class Release:
    """The scheduler gave back `ids` of a `resource` ("slot", "page") there (`Device.released`):
    where a lifecycle finding's resource was freed. A record for findings, not in the digest."""

    resource: str
    ids: tuple[int, ...]
    at: int  # the ops issued before it
    step: int
    site: Site | None


@dataclass(slots=True)
class Allocation:
    """Device memory handed to a new tensor: until an op writes them, its cells hold whatever the
    memory held before (garbage, on a GPU). A record for the checks (`no-uninit-read`), not in
    the digest: `seq` is the number of ops issued before it, `site` the program's frame that
    asked for it (`file:line function`)."""

    seq: int
    step: int
    buffer: str
    cells: np.ndarray
    site: str
    what: str  # the op that allocated it: "empty_like", "zeros", ...
    origin: Site | None = None  # the same frame, structured (`core/sites.py`), for findings


class Launch(NamedTuple):
    """What one forward runs, as the scheduler asked for it: what ranks compare
    (`rank-consistent`, `core/ranks.py`). Recorded only where `Trace.launches` is a list (a run
    of several ranks); never part of the digest."""

    seq: int  # the forward op's place in the trace
    phase: str
    uids: tuple[int, ...]
    positions: tuple[tuple[int, int], ...]  # each sequence's new positions, [start, end)


class Trace:
    """Operations and messages of one run, in issue order."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.reuses: list[Reuse] = []  # blocks the allocators handed out again
        self.releases: list[Release] = []  # resources the scheduler said it gave back
        self.verified: list[Verified] = []  # each verify sequence's result, as it ran
        # Device allocations, where a backend reports them (the simulated CUDA), in issue order.
        self.allocations: list[Allocation] = []
        self.messages: list[Message] = []  # sent by the scheduler
        self.received: list[Message] = []  # handed to the scheduler, with the iteration
        # Cells per buffer, as the recorder declares them (every access it records stays below):
        # the race checker sizes its shadow by them instead of scanning each access for its
        # largest cell. A trace read from a file has none; the checker then grows as it goes.
        self.sizes: dict[str, int] = {}
        # Each forward as launched, where a run compares ranks (None: not recorded).
        self.launches: list[Launch] | None = None
        self._next_event = 0

    def new_event_id(self) -> int:
        self._next_event += 1
        return self._next_event

    def add(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def next_seq(self) -> int:
        return len(self.ops)

    def cut(self, num_ops: int, num_messages: int, num_received: int, now: float) -> None:
        """Back to what it held at simulated time `now`, when it had that many operations and
        messages: what ran after (in a step a watchdog interrupted after a wall-clock time) is
        dropped, and an earlier operation that started or ended after `now` is unstarted or
        unfinished again, so the trace of an interrupted run is the same in every process."""
        del self.ops[num_ops:], self.messages[num_messages:], self.received[num_received:]
        if self.launches is not None:
            self.launches[:] = [x for x in self.launches if x.seq < num_ops]
        for op in self.ops:
            if op.start is not None and op.start > now and op.agent != HOST:
                op.start, op.delay = None, 0.0
            if op.end is not None and op.end > now:
                op.end = None

    def digest(self) -> str:
        """A hex digest of the canonical trace: same inputs give the same digest in any process.

        Numbers go through numpy (times rounded to the nanosecond, so float noise in a sum cannot
        change the digest), names through one joined string: this runs at the end of every run.
        """
        h = hashlib.blake2b(digest_size=16)
        ops = self.ops
        # Flat lists convert to numpy far faster than lists of tuples; None becomes NaN in a float
        # array, then -1 (the integers are far below 2**53, so exact in a float).
        times = np.array(list(chain.from_iterable(map(_TIMES, ops))), dtype=np.float64)
        h.update(np.nan_to_num(np.rint(times * 1e9), nan=-1.0).astype(np.int64).tobytes())
        ints = np.array(list(chain.from_iterable(map(_INTS, ops))), dtype=np.float64)
        h.update(np.nan_to_num(ints, nan=-1.0).astype(np.int64).tobytes())
        h.update(
            "\x1f".join(
                f"{op.agent}|{op.kind}|{op.phase}|{op.label}|{op.uids}|"
                + (
                    ",".join(f"{a.buffer}:{a.mode}:{len(a.cells)}" for a in op.accesses)
                    if op.accesses
                    else ""
                )
                for op in ops
            ).encode()
        )
        _hash_cells(h, [a.cells for op in ops if op.accesses for a in op.accesses])
        h.update(
            repr(
                [
                    (_t(m.time), m.step, m.uid, m.kind, m.token, m.finished, m.reason)
                    for m in self.messages + self.received
                ]
            ).encode()
        )
        return h.hexdigest()


class TraceView(Protocol):
    """What the checks read of a trace: a run's `Trace`, or a finished run's trace as it stood at
    an earlier event (checks deferred to after the run read it so)."""

    @property
    def ops(self) -> Sequence[Op]: ...

    @property
    def messages(self) -> list[Message]: ...

    @property
    def received(self) -> list[Message]: ...

    @property
    def sizes(self) -> dict[str, int]: ...

    @property
    def reuses(self) -> list[Reuse]: ...

    @property
    def releases(self) -> list[Release]: ...

    @property
    def allocations(self) -> list[Allocation]: ...


def _hash_cells(h: Any, cells: list[np.ndarray]) -> None:
    """Feed the concatenation of `cells` (as int64) to `h`, a bounded chunk at a time: one small
    buffer stays in cache where one concatenation of a whole run's cells (megabytes) would not."""
    buf = np.empty(1 << 16, dtype=np.int64)
    i = 0
    while i < len(cells):
        j, k = i, 0
        while j < len(cells) and k + len(cells[j]) <= len(buf):
            k += len(cells[j])
            j += 1
        if j == i:  # one access larger than the buffer
            h.update(np.ascontiguousarray(cells[i], dtype=np.int64))
            i += 1
            continue
        np.concatenate(cells[i:j], out=buf[:k], casting="unsafe")
        h.update(buf[:k])
        i = j


# An op's kind, for `map` over many ops (the kinds then searched in C, not op by op in Python).
op_kind = operator.attrgetter("kind")
_TIMES = operator.attrgetter("issue", "start", "end")
_INTS = operator.attrgetter("seq", "step", "batch", "records", "waits")


def _t(value: float | None) -> str:
    # Times are rounded to the nanosecond so that float noise in a sum cannot change the digest.
    return "-" if value is None else f"{value:.9f}"


def cells_range(row: int, width: int, start: int, stop: int) -> np.ndarray:
    """Flat indices of `buffer[row, start:stop]` in a row-major buffer of the given width."""
    base = row * width
    return np.arange(base + start, base + stop, dtype=np.int64)
