"""Happens-before race detection over footprints (vector clocks, TSan-style shadow cells).

Agents are the host and the streams. Edges: program order per agent, host issue -> stream operation,
event record -> stream wait / host wait. Operations are checked in issue order, a linearisation of
happens-before, so the check runs online. Each cell keeps its last writer (agent, clock) and each
agent's last read clock, in one shadow table for all buffers; an operation's reads (then its writes)
check and update their whole cell set in one vectorised step. Two accesses to a cell, one a write,
unordered by happens-before, are a race even when this run's timing made them harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from overlapcheck.core.trace import HOST, Access, Op, Reuse, TraceView

MAX_AGENTS = 8
_AGENT_BITS = 3  # MAX_AGENTS == 1 << _AGENT_BITS
# The hot path's reductions, without numpy's Python wrappers around them.
_max = np.maximum.reduce
_count = np.count_nonzero
# Shadow cells hold clocks (and clock * MAX_AGENTS + agent): 32 bits hold 268 M ops per agent,
# and half the bytes of int64 keep more of the shadow in cache.
_CELL = np.int32


@dataclass(frozen=True, slots=True)
class Race:
    kind: str  # RAW, WAR or WAW (first access, then second, in issue order)
    buffer: str
    cells: tuple[int, ...]  # a few of the conflicting cells
    first: int  # op seq
    second: int  # op seq


class _Shadow:
    """Shadow cells of all buffers in one cell space, a region per buffer, so that an operation's
    accesses of one mode are checked and updated in one gather and one scatter, whatever buffers
    they touch. A region grows (moves to the end) with the largest cell index seen.

    `writer[cell]` is the last write as `clock * MAX_AGENTS + agent` (0: never written: clocks
    start at 1); `reads[agent, cell]` the agent's clock at its last read (0: none; a write does
    not clear it). The host's reads are not kept: the host issues every op, so every op after a
    host read is ordered after it and none can overwrite it unordered. The ops behind a race are
    found again from (agent, clock) (`HappensBefore.op_of`). A read the race checker has not
    stored yet waits in `RaceDetector.pending`, stored before anything looks at its rows.
    """

    def __init__(self) -> None:
        # `writer` and `reads` are rows of one table, the writers first: a region's writers and
        # its known agents' read clocks are then one 2-D slice (`table[: agents + 1]`)
        self._use(np.zeros((MAX_AGENTS + 1, 1024), dtype=_CELL))
        self.used = 0
        self.regions: dict[str, tuple[int, int]] = {}  # buffer -> (first cell, cells)
        self.fixed: dict[str, int] = {}  # buffer -> first cell, for regions of a declared size
        # buffer -> its region's views (forgotten when the region moves, the arrays are
        # reallocated or an agent appears): its writers, and each agent's read clocks, made
        # apart, since a batch's fresh host buffer is only written by a stream (the host's
        # reads are not kept) and needs no read views
        self.writers: dict[str, np.ndarray] = {}
        self.readers: dict[str, list[np.ndarray]] = {}
        self.agents = 0  # the agents the views have read rows for

    def base(self, buffer: str, cells: np.ndarray, size: int | None = None) -> int:
        """Where `buffer`'s region starts, grown to hold `cells` (non-negative indices). A region
        of a declared `size` (`Trace.sizes`) is made that size once, and never scanned or moved:
        its start goes in `fixed`."""
        if size is not None and buffer not in self.regions:
            return self.sized(buffer, size)
        return self.grown(buffer, int(_max(cells)))

    def sized(self, buffer: str, size: int) -> int:
        """`base` for a buffer not placed yet, of a declared `size`."""
        start = self._place(buffer, max(size, 1), None)
        self.fixed[buffer] = start
        return start

    def grown(self, buffer: str, top: int) -> int:
        """`base` for a region already placed or of no declared size, given its largest cell."""
        region = self.regions.get(buffer)
        if region is not None and top < region[1]:
            return region[0]
        self.fixed.pop(buffer, None)  # past its declared size: it grows like any other now
        size = max(top + 1, 8) if region is None else max(top + 1, 2 * region[1])
        return self._place(buffer, size, region)

    def writer_view(self, buffer: str) -> np.ndarray:
        """`buffer`'s writers as a view into the shadow, indexed by the buffer's own cells."""
        start, size = self.regions[buffer]
        found = self.writers[buffer] = self.writer[start : start + size]
        return found

    def reader_views(self, buffer: str) -> list[np.ndarray]:
        """`buffer`'s read clocks of each agent known so far (`agents`), as views the same way."""
        start, size = self.regions[buffer]
        end = start + size
        found = self.readers[buffer] = [row[start:end] for row in self.rows[: self.agents]]
        return found

    def know(self, agents: int) -> None:
        """The trace has `agents` agents now: views made for fewer are forgotten."""
        if agents != self.agents:
            self.agents = agents
            self.readers.clear()

    def _use(self, table: np.ndarray) -> None:
        self.table = table
        self.writer: np.ndarray = table[0]
        self.reads: np.ndarray = table[1:]
        self.rows = list(self.reads)  # its rows, each agent's (slicing a row is cheaper)

    def _forget_views(self) -> None:
        self.writers.clear()
        self.readers.clear()

    def _place(self, buffer: str, size: int, region: tuple[int, int] | None) -> int:
        self.writers.pop(buffer, None)
        self.readers.pop(buffer, None)
        base = self.used
        self.used += size
        known = self.agents + 1  # (the writers' row and the known agents' read rows: the
        # others are all 0, and copying them would touch memory that no read ever uses)
        if self.used > len(self.writer):
            capacity = max(self.used, 2 * len(self.writer))
            table = np.zeros((MAX_AGENTS + 1, capacity), dtype=_CELL)
            table[:known, :base] = self.table[:known, :base]
            self._use(table)
            self._forget_views()
        if region is not None:
            old, cells_before = region
            rows = self.table[:known]
            rows[:, base : base + cells_before] = rows[:, old : old + cells_before]
        self.regions[buffer] = (base, size)
        return base


# A buffer's watermarks: per agent, the clock of its latest write and of its latest read of the
# buffer (0: none); then the agents with a write, and with a read, of it.
Marks = tuple[list[int], list[int], list[int], list[int]]
VectorClock = tuple[int, ...]  # an op's clock: entry i is agent i's (MAX_AGENTS entries)


class HappensBefore:
    """Vector clocks for the host and the streams, advanced op by op in issue order. Python lists
    and tuples: with a handful of agents, numpy's per-call cost is most of the work."""

    def __init__(self) -> None:
        self.agents: dict[str, int] = {HOST: 0}
        self.clocks: list[list[int]] = [[0] * MAX_AGENTS]
        self.events: dict[int, VectorClock] = {}
        # Each op's agent, in issue order (`Clocks.agent`): an agent's clock counts its ops, so
        # the op behind (agent, clock) is found there, for a race's report only.
        self.issued: list[int] = []
        # Per agent, where its first ops are in `issued` (found when a race is reported: `op_of`)
        self._by_agent: dict[int, list[int]] = {}
        self._index_of: list[int] | None = None
        # The host's clock changes only at host ops: per agent, how many host ops its clock has
        # taken in (a stream op after no new host op need not take the host's past in again).
        self.host_ops = 0
        self.merged: list[int] = [0]

    def op_of(self, agent: int, clock: int) -> int:
        """Where `agent`'s op at `clock` (its clock-th op) is in issue order."""
        issued = self.issued
        if issued is not self._index_of:  # (another list of agents: index it again)
            self._index_of, self._by_agent = issued, {}
        found = self._by_agent.get(agent)
        if found is None:
            found = self._by_agent[agent] = []
        # this agent's ops up to the clock-th, each found once, in C (`list.index`): a race
        # reported again every iteration asks for one op of the last few
        at = found[-1] + 1 if found else 0
        while len(found) < clock:
            try:
                at = issued.index(agent, at)
            except ValueError:
                break
            found.append(at)
            at += 1
        if not 0 < clock <= len(found):
            raise ValueError(f"agent {agent} has no op at clock {clock}")
        return found[clock - 1]

    def index(self, agent: str) -> int:
        if agent not in self.agents:
            if len(self.agents) == MAX_AGENTS:
                raise ValueError(f"more than {MAX_AGENTS} agents in one trace")
            self.agents[agent] = len(self.agents)
            self.clocks.append([0] * MAX_AGENTS)
            self.merged.append(-1)
        return self.agents[agent]

    def advance(self, ops: Sequence[Op], agents: list[int], kept: list[VectorClock | None]) -> None:
        """Advance over `ops`, in issue order: each op's agent index goes to `agents`, and its
        vector clock (the clock its accesses happen at) to `kept` for an op with accesses or a
        forward, None for the others. One loop with its state in locals: it runs for every op
        of every run."""
        index, clocks, events, merged = self.agents, self.clocks, self.events, self.merged
        self.issued = agents
        host_clock = clocks[0]
        host_ops = self.host_ops
        for op in ops:
            a = index.get(op.agent)
            if a is None:
                a = self.index(op.agent)
            vc = clocks[a]
            if not a:
                host_ops += 1
            elif merged[a] != host_ops:  # the host issued it: the host's past is its past
                _join(vc, host_clock, len(index))
                merged[a] = host_ops
            vc[a] += 1
            if op.waits is not None:
                recorded = events.get(op.waits)
                if recorded is not None:
                    _join(vc, recorded, len(index))
            if op.records is not None:
                events[op.records] = tuple(vc)
            agents.append(a)
            kept.append(tuple(vc) if op.accesses or op.kind == "forward" else None)
        self.host_ops = host_ops


def _join(vc: list[int], other: Sequence[int], agents: int) -> None:
    """`vc` becomes the entrywise maximum of the two (entries past `agents` are all 0)."""
    for i in range(agents):
        if other[i] > vc[i]:
            vc[i] = other[i]


class Clocks:
    """One happens-before pass over a trace, shared by every check that needs vector clocks
    (`no-race`, `slot-not-in-flight`, `no-hidden-sync`): each op's agent and vector clock."""

    def __init__(self, trace: TraceView) -> None:
        self.trace = trace
        self.hb = HappensBefore()
        self.agent: list[int] = []
        # An op's clock is kept for the ops the checks ask about (those with accesses, forwards),
        # not for every span, record and wait.
        self.vc: list[VectorClock | None] = []

    def advance(self) -> int:
        """Clocks for every op issued so far; how many there are."""
        ops, done = self.trace.ops, len(self.agent)
        if done != len(ops):
            self.hb.advance(ops[done:], self.agent, self.vc)
        return len(self.agent)


class RaceDetector:
    def __init__(self, clocks: Clocks | None = None) -> None:
        self.clocks = clocks
        self.sizes: dict[str, int] = {}  # the trace's declared buffer sizes
        self.ops: Sequence[Op] = ()  # the trace's, as of the last check
        self.shadow = _Shadow()
        self.checked = 0
        # Per buffer and agent, the clock of the agent's latest write (read) of the buffer: every
        # cell's last write by that agent (its read clock of that agent) is at most this. An
        # access ordered after every agent's latest write of its buffer cannot race with a write;
        # a write ordered after every agent's latest read of its buffer, with no read. (An
        # agent's own accesses are in its past, so they never stand in the way.)
        # With each, the agents whose entry is not 0, in the order they first accessed it: only
        # they can stand in the way, so a test looks at a buffer's one or two agents, not all
        # MAX_AGENTS (a `map` over all of them cost more than the rest of the fast path). The
        # host is never among them: it issues every op, so every op after one of its writes is
        # ordered after it (and its reads are not kept, see `_Shadow`).
        self.marks: dict[str, Marks] = {}
        # Per buffer, the reads of the fast path not yet in the shadow's read rows, in issue
        # order: (agent, the buffer's cells, clock). A read row is looked at only when a write of
        # the buffer may overwrite an unordered read, or on the slow paths; until then its
        # scatters wait (`_flush`), and a buffer that only its readers write (the KV cache, the
        # token pool under one stream) never pays them: a decode step's KV read is hundreds of
        # cells.
        self.pending: dict[str, list[tuple[int, np.ndarray, int]]] = {}
        self.reuses = 0  # the trace's reuses looked at (`_carry`)

    @property
    def hb(self) -> HappensBefore:
        assert self.clocks is not None
        return self.clocks.hb

    def check(self, trace: TraceView) -> Race | None:
        """Check the operations issued since the last call; the first race, or None."""
        if self.clocks is None:
            self.clocks = Clocks(trace)
        clocks = self.clocks
        n = clocks.advance()
        self.shadow.know(len(clocks.hb.agents))
        ops, kept, agent = trace.ops, clocks.vc, clocks.agent
        self.sizes, self.ops = trace.sizes, ops
        reuses = trace.reuses
        start = self.checked
        while True:
            # ops up to the next reuse that moves memory to another buffer: its old cells'
            # accesses are carried over before the ops after it
            stop = n
            while self.reuses < len(reuses):
                reuse = reuses[self.reuses]
                if reuse.source is not None:
                    if reuse.at > start:
                        stop = min(reuse.at, n)
                        break
                    self._carry(reuse)
                self.reuses += 1
            for seq in range(start, stop):
                vc = kept[seq]
                if vc is None:
                    continue  # no accesses (nor a forward): nothing to check
                op = ops[seq]
                accesses = op.accesses
                if accesses:
                    a = agent[seq]
                    if a or len(accesses) != 1:
                        race = self._op(op, a, vc)
                    else:
                        race = self._host_op(op, accesses[0], vc)
                    if race is not None:
                        self.checked = seq + 1  # the next call goes on after it
                        return race
            if stop == n:
                break
            start = stop
        self.checked = n
        return None

    def _carry(self, reuse: Reuse) -> None:
        """The caching allocator gave memory of `reuse.source` to `reuse.buffer`: each new cell
        takes the last write and each agent's last read of the old cells it overlaps (the latest
        of several), and the new buffer the old one's watermarks, so an access of the new tensor
        unordered with a use of the old one is a race on the new buffer's cells."""
        source, buffer = reuse.source, reuse.buffer
        shadow = self.shadow
        (a, b), (c, d) = reuse.cells, reuse.source_cells
        if source is None or source not in shadow.regions or b <= a or d <= c:
            return  # never accessed: nothing to carry
        self._flush(source)
        shadow.grown(source, d - 1)  # (placed: it was accessed)
        size = self.sizes.get(buffer)
        if size is not None and buffer not in shadow.regions:
            shadow.sized(buffer, size)  # placed at its declared size
        else:
            shadow.grown(buffer, b - 1)
        old, new = shadow.regions[source][0], shadow.regions[buffer][0]
        n, m = b - a, d - c
        # the writers and every known agent's read clocks at once (rows of one 2-D view)
        rows = shadow.table[: shadow.agents + 1]
        was = rows[:, old + c : old + d]
        into = rows[:, new + a : new + b]
        # (the methods' and functions' Python wrappers cost more than these small arrays)
        if n < m and m % n == 0 and source != buffer:
            # a larger dtype, each new cell k old ones (int64 over int32's memory: k=2): the
            # latest of them, one share at a time into the new cells, costs half a reduce over
            # a 3-D view
            shares = was.reshape(len(rows), n, m // n)
            for j in range(m // n):
                np.maximum(into, shares[:, :, j], out=into)
        else:
            if n > m:  # a smaller dtype: each old cell is several new ones
                was = was.repeat(n // m, axis=1)
            elif n < m:  # a larger one: each new cell is several old ones
                was = _max(was.reshape(len(rows), n, m // n), axis=2)
            np.maximum(into, was, out=into)
        marks = self.marks.get(source)
        if marks is not None:
            mine = self.marks.get(buffer)
            if mine is None:  # (a new buffer's, most often: the old one's, as they are)
                self.marks[buffer] = (marks[0][:], marks[1][:], marks[2][:], marks[3][:])
                return
            for k in (0, 1):
                mine[k][:] = map(max, mine[k], marks[k])
                agents = mine[k + 2]
                agents.extend(x for x in marks[k + 2] if x not in agents)

    def _op(self, op: Op, a: int, vc: VectorClock) -> Race | None:
        """All of an op's accesses at once, when its reads come before its writes (as in every op
        the recorder makes): then its reads see the state before the op, as do its writes but for
        its own reads, which never race with them. The common case looks at no cell: every
        access ordered after the last writes of its buffer, every write after its last reads
        (the buffers' watermarks, `marks`, show it); then the shadow is only updated, through
        each region's views. A write the read watermarks do not cover is checked against the
        reads of its cells; an access the write watermarks do not cover, in `_checked`."""
        shadow = self.shadow
        fixed, marks_of = shadow.fixed, self.marks
        ordered, writing, reads_first = True, False, True
        unsure: list[Access] = []  # writes that may overwrite an unordered read
        touched: list[tuple[Access, Marks]] = []
        for acc in op.accesses:
            cells = acc.cells
            if not len(cells):
                continue
            buffer = acc.buffer
            if buffer not in fixed:
                shadow.base(buffer, cells, self.sizes.get(buffer))
            marks = marks_of.get(buffer) or self._marks(buffer)
            touched.append((acc, marks))
            if ordered:
                writes = marks[0]
                for b in marks[2]:
                    if writes[b] > vc[b]:
                        ordered = False
                        break
            if acc.mode == "r":
                reads_first = reads_first and not writing
            else:
                writing = True
                reads = marks[1]
                for b in marks[3]:
                    if reads[b] > vc[b]:
                        unsure.append(acc)
                        break
        if not reads_first:
            return self._one_by_one(op, a, vc, op.accesses)
        if not ordered:
            return self._checked(op, a, vc)
        writers, readers, pending = shadow.writers, shadow.readers, self.pending
        for acc in unsure:
            # Only the agents whose latest read of the buffer this op is not ordered after can
            # have read one of its cells unordered with it.
            if pending.get(acc.buffer):
                self._flush(acc.buffer)
            rows = readers.get(acc.buffer) or shadow.reader_views(acc.buffer)
            marks = marks_of[acc.buffer]
            for b in marks[3]:
                if marks[1][b] > vc[b]:
                    read = rows[b][acc.cells]
                    # (a few cells: a list's max costs less than numpy's reduce)
                    if (max(read.tolist()) if len(read) <= 32 else _max(read)) > vc[b]:
                        return self._one_by_one(op, a, vc, op.accesses, ordered=True)
        clock = vc[a]
        value = clock * MAX_AGENTS + a
        for acc, marks in touched:
            if acc.mode == "r":
                if a:  # (the host's reads are not kept: see `_Shadow`)
                    waiting = pending.get(acc.buffer)
                    if waiting is None:
                        waiting = pending[acc.buffer] = []
                    waiting.append((a, acc.cells, clock))
                    if not marks[1][a]:
                        marks[3].append(a)
                    marks[1][a] = clock
            else:
                view = writers.get(acc.buffer)
                if view is None:
                    view = shadow.writer_view(acc.buffer)
                view[acc.cells] = value  # the reads stay: see `_store`
                if a and not marks[0][a]:  # (the host's writes stand in nobody's way)
                    marks[2].append(a)
                marks[0][a] = clock
        return None

    def _host_op(self, op: Op, acc: Access, vc: VectorClock) -> Race | None:
        """`_op` for a host op of one access, two ops in three of a run (the host's work on
        pinned buffers): the same steps, without the bookkeeping of several accesses."""
        cells = acc.cells
        if not len(cells):
            return None
        shadow, buffer = self.shadow, acc.buffer
        if buffer not in shadow.fixed:
            shadow.base(buffer, cells, self.sizes.get(buffer))
        marks = self.marks.get(buffer) or self._marks(buffer)
        writes = marks[0]
        for b in marks[2]:
            if writes[b] > vc[b]:
                return self._checked(op, 0, vc)
        if acc.mode == "r":
            return None  # (the host's reads are not kept: see `_Shadow`)
        reads = marks[1]
        for b in marks[3]:
            if reads[b] > vc[b]:
                # a write that may overwrite an unordered read: as in `_op`
                if self.pending.get(buffer):
                    self._flush(buffer)
                rows = shadow.readers.get(buffer) or shadow.reader_views(buffer)
                for c in marks[3]:
                    if reads[c] > vc[c]:
                        read = rows[c][cells]
                        if (max(read.tolist()) if len(read) <= 32 else _max(read)) > vc[c]:
                            return self._one_by_one(op, 0, vc, op.accesses, ordered=True)
                break
        view = shadow.writers.get(buffer)
        if view is None:
            view = shadow.writer_view(buffer)
        if len(cells) == 1:  # (most of them: one element, set without a fancy index)
            view[cells[0]] = vc[0] * MAX_AGENTS  # the reads stay: see `_store`
        else:
            view[cells] = vc[0] * MAX_AGENTS
        writes[0] = vc[0]
        return None

    def _checked(self, op: Op, a: int, clock: VectorClock) -> Race | None:
        """`_op` for an op with an access the write watermarks do not cover: one vectorised check
        over all its cells, in the one cell space; access by access on a race, which names the
        first racing access."""
        self._flush_all(op.accesses)
        shadow = self.shadow
        vc = np.array(clock, dtype=np.int64)
        parts = [acc.cells + shadow.regions[acc.buffer][0] for acc in op.accesses if len(acc.cells)]
        split = sum(len(acc.cells) for acc in op.accesses if acc.mode == "r")
        cells = parts[0] if len(parts) == 1 else np.concatenate(parts)
        # The last write races unless this agent's clock covers it: with writes kept as
        # clock * MAX_AGENTS + agent, unless its clock is at most vc[its agent].
        last = shadow.writer[cells]
        if _count((last >> _AGENT_BITS) > vc[last & (MAX_AGENTS - 1)]):
            return self._one_by_one(op, a, vc, op.accesses)
        if split < len(cells):
            # A write also races with another agent's read since the last write, if not covered.
            n = len(self.hb.agents)
            late = shadow.reads[:n, cells[split:]] > vc[:n, None]
            late[a] = False
            if _count(late):
                return self._one_by_one(op, a, vc, op.accesses)
        self._store(op, a, clock[a], cells, split)
        return None

    def _store(self, op: Op, a: int, clock: int, cells: np.ndarray, split: int) -> None:
        """Record a checked op's accesses, at the agent's `clock`, in the shadow: `cells` in the
        one cell space, the first `split` of them read, the rest written."""
        shadow = self.shadow
        if split and a:  # (the host's reads are not kept: see `_Shadow`)
            shadow.reads[a][cells[:split]] = clock
        # The reads before a write stay: each is ordered before it (or that was a race), so
        # before any later op ordered after it, and a later op not ordered after it races with
        # the write itself, which the writer check finds first.
        if split < len(cells):
            shadow.writer[cells[split:]] = clock * MAX_AGENTS + a
        self._mark(op, a, clock)

    def _flush(self, buffer: str) -> None:
        """The buffer's waiting reads into the read rows, in issue order (each agent's clock only
        grows, so a later read of a cell leaves its clock there, as when stored at once)."""
        waiting = self.pending.pop(buffer, None)
        if waiting:
            shadow = self.shadow
            rows = shadow.readers.get(buffer) or shadow.reader_views(buffer)
            for a, cells, clock in waiting:
                rows[a][cells] = clock

    def _flush_all(self, accesses: list[Access]) -> None:
        """Before a slow path reads or stores read rows of these accesses' buffers."""
        pending = self.pending
        for acc in accesses:
            if acc.buffer in pending:
                self._flush(acc.buffer)

    def _marks(self, buffer: str) -> Marks:
        marks = self.marks.get(buffer)
        if marks is None:
            marks = self.marks[buffer] = ([0] * MAX_AGENTS, [0] * MAX_AGENTS, [], [])
        return marks

    def _raise(self, buffer: str, read: bool, a: int, clock: int) -> None:
        """Agent `a` accessed `buffer` at `clock`: its watermark of that mode is now `clock`
        (the host's reads have none: see `_Shadow`)."""
        if read and not a:
            return
        marks = self._marks(buffer)
        if a and not marks[read][a]:  # (nor do its writes stand in anybody's way)
            marks[3 if read else 2].append(a)
        marks[read][a] = clock

    def _mark(self, op: Op, a: int, clock: int) -> None:
        """Raise the watermarks of every buffer the op touched (all its accesses recorded)."""
        for acc in op.accesses:
            if len(acc.cells):
                self._raise(acc.buffer, acc.mode == "r", a, clock)

    def _one_by_one(
        self,
        op: Op,
        a: int,
        clock: VectorClock | np.ndarray,
        accesses: list[Access],
        ordered: bool = False,
    ) -> Race | None:
        """Access by access, in order: the first race, the accesses before it stored. `ordered`:
        the op is ordered after every last write of its buffers (their write watermarks say so,
        as on `_op`'s fast path), so no access's last writer is looked at: a write that may
        overwrite an unordered read brought it here."""
        self._flush_all(accesses)
        vc = np.asarray(clock, dtype=np.int64)
        for acc in accesses:
            race = self._access(op, a, vc, acc, ordered)
            if race is not None:
                return race
        return None

    def _access(
        self, op: Op, a: int, vc: np.ndarray, acc: Access, ordered: bool = False
    ) -> Race | None:
        shadow = self.shadow
        cells = acc.cells
        if not len(cells):
            return None
        at = cells + shadow.base(acc.buffer, cells)
        if not ordered:  # (else no last write to look at: see `_one_by_one`)
            last = shadow.writer[at]
            # (shifts and masks: the cells are never negative; numpy's small calls are the cost)
            w_agent, w_clock = last & (MAX_AGENTS - 1), last >> _AGENT_BITS
            unordered = w_clock > vc[w_agent]
            if _count(unordered):
                kind = "RAW" if acc.mode == "r" else "WAW"
                i = int(unordered.argmax())
                first = self.ops[self.hb.op_of(int(w_agent[i]), int(w_clock[i]))].seq
                return self._race(kind, acc, cells[unordered], first, op)
        if acc.mode == "r":
            if a:  # (the host's reads are not kept: see `_Shadow`)
                shadow.reads[a][at] = vc[a]
                self._raise(acc.buffer, True, a, int(vc[a]))
            return None
        n = len(self.hb.agents)
        reads = shadow.reads[:n, at] > vc[:n, None]
        reads[a] = False
        if _count(reads):
            agent, idx = divmod(int(reads.argmax()), len(at))  # the first, row by row
            conflicting = cells[reads[agent]]
            first = self.ops[self.hb.op_of(int(agent), int(shadow.reads[agent, at[idx]]))].seq
            return self._race("WAR", acc, conflicting, first, op)
        shadow.writer[at] = vc[a] * MAX_AGENTS + a  # the reads stay: see `_op`
        self._raise(acc.buffer, False, a, int(vc[a]))
        return None

    @staticmethod
    def _race(kind: str, acc: Access, cells: np.ndarray, first: int, op: Op) -> Race:
        return Race(kind, acc.buffer, tuple(int(c) for c in cells[:8]), first, op.seq)
