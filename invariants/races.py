"""Happens-before race detection over footprints (vector clocks, TSan-style shadow cells).

Agents are the host and the streams. Edges: program order per agent, host issue -> stream operation,
event record -> stream wait / host wait. Operations are checked in issue order, a linearisation of
happens-before, so the check runs online. Per buffer, each cell keeps its last writer (agent, clock,
op) and each agent's last read (clock, op); an access checks and updates its whole cell set in one
vectorised step. Two accesses to a cell, one a write, unordered by happens-before, are a race even
when this run's timing made them harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapcheck.core.trace import HOST, Access, Op, Trace

MAX_AGENTS = 8


@dataclass(frozen=True, slots=True)
class Race:
    kind: str  # RAW, WAR or WAW (first access, then second, in issue order)
    buffer: str
    cells: tuple[int, ...]  # a few of the conflicting cells
    first: int  # op seq
    second: int  # op seq


class _Shadow:
    """Shadow state of one buffer; grows with the largest cell index seen."""

    def __init__(self) -> None:
        self.size = 0
        self.w_agent = np.empty(0, dtype=np.int8)  # 0 with clock 0: never written
        self.w_clock = np.empty(0, dtype=np.int64)
        self.w_op = np.empty(0, dtype=np.int64)
        self.r_clock = np.empty((MAX_AGENTS, 0), dtype=np.int64)
        self.r_op = np.empty((MAX_AGENTS, 0), dtype=np.int64)

    def ensure(self, top: int) -> None:
        if top < self.size:
            return
        new = max(top + 1, 2 * self.size, 64)
        grow = new - self.size
        self.w_agent = np.concatenate([self.w_agent, np.zeros(grow, dtype=np.int8)])
        self.w_clock = np.concatenate([self.w_clock, np.zeros(grow, dtype=np.int64)])
        self.w_op = np.concatenate([self.w_op, np.full(grow, -1, dtype=np.int64)])
        self.r_clock = np.concatenate(
            [self.r_clock, np.zeros((MAX_AGENTS, grow), dtype=np.int64)], axis=1
        )
        self.r_op = np.concatenate(
            [self.r_op, np.full((MAX_AGENTS, grow), -1, dtype=np.int64)], axis=1
        )
        self.size = new


class HappensBefore:
    """Vector clocks for the host and the streams, advanced op by op in issue order."""

    def __init__(self) -> None:
        self.agents: dict[str, int] = {HOST: 0}
        self.clocks: list[np.ndarray] = [np.zeros(MAX_AGENTS, dtype=np.int64)]
        self.events: dict[int, np.ndarray] = {}
        self.ops: list[list[int]] = [[]]  # per agent: op seq by clock - 1

    def op_of(self, agent: int, clock: int) -> int:
        return self.ops[agent][clock - 1]

    def index(self, agent: str) -> int:
        if agent not in self.agents:
            if len(self.agents) == MAX_AGENTS:
                raise ValueError(f"more than {MAX_AGENTS} agents in one trace")
            self.agents[agent] = len(self.agents)
            self.clocks.append(np.zeros(MAX_AGENTS, dtype=np.int64))
            self.ops.append([])
        return self.agents[agent]

    def advance(self, op: Op) -> tuple[int, np.ndarray]:
        """The op's agent index and its vector clock (the clock its accesses happen at)."""
        a = self.index(op.agent)
        vc = self.clocks[a]
        if a != 0:
            np.maximum(
                vc, self.clocks[0], out=vc
            )  # the host issued it: the host's past is its past
        vc[a] += 1
        self.ops[a].append(op.seq)
        if op.waits is not None and op.waits in self.events:
            np.maximum(vc, self.events[op.waits], out=vc)
        if op.records is not None:
            self.events[op.records] = vc.copy()
        return a, vc


class RaceDetector:
    def __init__(self) -> None:
        self.hb = HappensBefore()
        self.shadows: dict[str, _Shadow] = {}
        self.checked = 0

    def check(self, trace: Trace) -> Race | None:
        """Check the operations issued since the last call; the first race, or None."""
        ops = trace.ops
        while self.checked < len(ops):
            op = ops[self.checked]
            self.checked += 1
            a, vc = self.hb.advance(op)
            for acc in op.accesses:
                race = self._access(op, a, vc, acc)
                if race is not None:
                    return race
        return None

    def _access(self, op: Op, a: int, vc: np.ndarray, acc: Access) -> Race | None:
        cells = acc.cells
        if len(cells) == 0:
            return None
        shadow = self.shadows.get(acc.buffer)
        if shadow is None:
            shadow = self.shadows[acc.buffer] = _Shadow()
        shadow.ensure(int(cells.max()))
        # The last write races unless this agent's clock already covers it. Clocks start at 1, so
        # a cell never written (clock 0) never races.
        unordered = shadow.w_clock[cells] > vc[shadow.w_agent[cells]]
        if unordered.any():
            kind = "RAW" if acc.mode == "r" else "WAW"
            return self._race(
                kind, acc, cells[unordered], int(shadow.w_op[cells[unordered][0]]), op
            )
        if acc.mode == "r":
            shadow.r_clock[a, cells] = vc[a]
            shadow.r_op[a, cells] = op.seq
            return None
        n = len(self.hb.agents)
        reads = shadow.r_clock[:n, cells] > vc[:n, None]
        reads[a] = False
        if reads.any():
            agent, idx = np.argwhere(reads)[0]
            conflicting = cells[reads[agent]]
            return self._race("WAR", acc, conflicting, int(shadow.r_op[agent, cells[idx]]), op)
        shadow.w_agent[cells] = a
        shadow.w_clock[cells] = vc[a]
        shadow.w_op[cells] = op.seq
        shadow.r_clock[:n, cells] = 0
        return None

    @staticmethod
    def _race(kind: str, acc: Access, cells: np.ndarray, first: int, op: Op) -> Race:
        return Race(kind, acc.buffer, tuple(int(c) for c in cells[:8]), first, op.seq)
