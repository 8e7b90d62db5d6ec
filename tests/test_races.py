"""The happens-before race checker on small hand-made traces: ordered accesses pass; each missing
edge kind is caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapcheck.core.trace import HOST, Access, Op, Reuse, Trace
from overlapcheck.invariants.hbgraph import clock_ordered, explain, hb_graph, ordered
from overlapcheck.invariants.races import Clocks, RaceDetector


class Builder:
    def __init__(self) -> None:
        self.trace = Trace()

    def op(
        self,
        agent: str,
        *accesses: tuple[str, str, list[int]],
        records: int | None = None,
        waits: int | None = None,
        kind: str = "op",
    ) -> Op:
        acc = [Access(buf, np.array(cells, dtype=np.int64), mode) for buf, mode, cells in accesses]  # type: ignore[arg-type]
        op = Op(
            self.trace.next_seq(),
            agent,
            kind,
            0,
            "test",
            0.0,
            label=f"{agent}{self.trace.next_seq()}",
            accesses=acc,
            records=records,
            waits=waits,
        )
        return self.trace.add(op)

    def race(self) -> object:
        return RaceDetector().check(self.trace)


def test_same_stream_program_order_is_ordered() -> None:
    b = Builder()
    b.op("engine", ("kv", "w", [1, 2]))
    b.op("engine", ("kv", "r", [1, 2]))
    b.op("engine", ("kv", "w", [2]))
    assert b.race() is None


def test_two_streams_without_an_edge_race() -> None:
    b = Builder()
    b.op("engine", ("kv", "w", [1, 2]))
    b.op("scheduler", ("kv", "w", [2, 3]))
    race = b.race()
    assert race is not None and race.kind == "WAW" and race.cells == (2,)
    assert not ordered(b.trace, 0, 1)


def test_event_record_and_wait_order_two_streams() -> None:
    b = Builder()
    b.op("engine", ("kv", "w", [1]))
    b.op("engine", records=1)
    b.op("scheduler", waits=1)
    b.op("scheduler", ("kv", "r", [1]))
    assert b.race() is None
    assert ordered(b.trace, 0, 3)


def test_wait_on_an_event_recorded_before_the_write_does_not_order_it() -> None:
    b = Builder()
    b.op("engine", records=1)
    b.op("engine", ("kv", "w", [1]))
    b.op("scheduler", waits=1)
    b.op("scheduler", ("kv", "r", [1]))
    race = b.race()
    assert race is not None and race.kind == "RAW"


def test_host_issue_orders_host_writes_before_stream_reads() -> None:
    b = Builder()
    b.op(HOST, ("host:staging", "w", [0, 1]))
    b.op("scheduler", ("host:staging", "r", [0, 1]))
    assert b.race() is None


def test_host_rewrite_without_waiting_for_the_copy_is_a_war_race() -> None:
    b = Builder()
    b.op(HOST, ("host:staging", "w", [0, 1]))
    b.op("scheduler", ("host:staging", "r", [0, 1]))
    b.op(HOST, ("host:staging", "w", [0]))
    race = b.race()
    assert race is not None and race.kind == "WAR" and (race.first, race.second) == (1, 2)
    assert "host did not wait" in explain(
        b.trace, b.trace.ops[1], b.trace.ops[2]
    ) or "ran" in explain(b.trace, b.trace.ops[1], b.trace.ops[2])


def test_host_wait_orders_stream_writes_before_host_reads() -> None:
    b = Builder()
    b.op("engine", ("host:out1", "w", [0]))
    b.op("engine", records=4)
    b.op(HOST, waits=4, kind="host_wait")
    b.op(HOST, ("host:out1", "r", [0]))
    assert b.race() is None


def test_host_read_without_waiting_is_a_raw_race_and_explained() -> None:
    b = Builder()
    b.op("engine", ("host:out1", "w", [0]))
    b.op(HOST, ("host:out1", "r", [0]))
    race = b.race()
    assert race is not None and race.kind == "RAW"
    assert "the host did not wait on an event recorded on engine" in explain(
        b.trace, b.trace.ops[0], b.trace.ops[1]
    )


def test_reads_never_race_with_reads_and_disjoint_cells_never_race() -> None:
    b = Builder()
    b.op("engine", ("kv", "r", [1, 2]))
    b.op("scheduler", ("kv", "r", [1, 2]))
    b.op("scheduler", ("kv", "w", [3]))
    b.op("engine", ("kv", "w", [4]))
    assert b.race() is None


def test_transitive_order_through_the_host() -> None:
    """engine write -> event -> host wait -> host issues a scheduler-stream write: ordered."""
    b = Builder()
    b.op("engine", ("token_pool", "w", [5]))
    b.op("engine", records=9)
    b.op(HOST, waits=9, kind="host_wait")
    b.op("scheduler", ("token_pool", "w", [5]))
    assert b.race() is None
    graph = hb_graph(b.trace)
    assert graph.edges[2, 3]["why"] == "host issue"


@pytest.mark.parametrize("mode", ["r", "w"])
def test_war_and_waw_against_an_earlier_unordered_access(mode: str) -> None:
    b = Builder()
    b.op("engine", ("page_table", mode, [7]))
    b.op("scheduler", ("page_table", "w", [7]))
    race = b.race()
    assert race is not None and race.kind == ("WAR" if mode == "r" else "WAW")


@pytest.mark.parametrize("path", ["checked", "one by one"])
def test_a_slow_path_sees_the_reads_the_fast_path_left_waiting(path: str) -> None:
    # The engine's KV read takes the fast path, which leaves its scatter waiting (the KV cache
    # is written by its reader alone, most of the time). The scheduler's write of a cell it read
    # takes a slow path: cell by cell after an access the write watermarks do not cover, or one
    # by one for an op that writes before it reads. Either must see the waiting read: a WAR.
    b = Builder()
    b.op("transfer", ("y", "w", [5]))
    b.op("engine", ("kv", "r", [1, 2]))
    if path == "checked":
        b.op("scheduler", ("y", "r", [6]), ("kv", "w", [2]))
    else:
        b.op("scheduler", ("kv", "w", [2]), ("z", "r", [0]))
    race = b.race()
    assert race is not None and race.kind == "WAR" and race.cells == (2,) and race.first == 1


_AGENTS = (HOST, "engine", "scheduler", "copy")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_AGENTS),
            st.sampled_from(("access", "record", "wait")),
            st.integers(1, 3),  # the event recorded or waited for
        ),
        min_size=2,
        max_size=25,
    )
)
def test_the_clocks_order_two_accesses_exactly_as_the_graph_does(
    steps: list[tuple[str, str, int]],
) -> None:
    # `no-race` explains a race from the vector clocks: they must agree with the graph's paths.
    b = Builder()
    for agent, what, event in steps:
        if what == "access":
            b.op(agent, ("x", "r", [0]))
        else:
            b.op(agent, **{"records" if what == "record" else "waits": event})
    clocks = Clocks(b.trace)
    clocks.advance()
    with_access = [op.seq for op in b.trace.ops if op.accesses]
    for i, first in enumerate(with_access):
        for second in with_access[i + 1 :]:
            assert clock_ordered(clocks, first, second) == ordered(b.trace, first, second)


@pytest.mark.parametrize("k", [2, 4, 3])
@pytest.mark.parametrize("mode", ["r", "w"])
def test_memory_reused_by_a_larger_dtype_carries_each_old_cells_accesses(k: int, mode: str) -> None:
    # `old` (8 cells) is freed and its memory given to `new`, k old cells a new cell (3: not a
    # multiple of 8, only its first 2 new cells carried); an unordered write of the new buffer
    # races exactly with the new cells over old cells the engine accessed
    n = 8 // k
    b = Builder()
    b.op("engine", ("old", mode, [1, 6]))
    b.trace.reuses.append(
        Reuse("new", len(b.trace.ops), "scheduler", None, 0, None, 0, "old", (0, n), (0, n * k))
    )
    b.op("scheduler", ("new", "w", list(range(n))))
    race = b.race()
    assert race is not None and race.kind == ("WAR" if mode == "r" else "WAW")
    assert race.buffer == "new" and race.first == 0 and race.second == 1
    assert race.cells == tuple(sorted({c // k for c in (1, 6) if c < n * k}))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([HOST, "engine", "scheduler"]), min_size=1, max_size=30), st.data())
def test_op_of_finds_each_agents_clock_th_op(agents: list[str], data: st.DataObject) -> None:
    b = Builder()
    for agent in agents:
        b.op(agent, ("buf", "r", [0]))
    clocks = Clocks(b.trace)
    clocks.advance()
    hb = clocks.hb
    # asked in any order (a race reported late may name an early op), each answer the one the
    # agent's own count of ops gives
    asks = data.draw(st.lists(st.sampled_from(sorted(set(agents))), max_size=20))
    for name in asks + sorted(set(agents)):
        a = hb.agents[name]
        mine = [i for i, x in enumerate(clocks.agent) if x == a]
        clock = data.draw(st.integers(1, len(mine)))
        assert hb.op_of(a, clock) == mine[clock - 1]
        for bad in (0, len(mine) + 1):
            with pytest.raises(ValueError, match="no op at clock"):
                hb.op_of(a, bad)
