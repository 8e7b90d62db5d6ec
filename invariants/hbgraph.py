"""The happens-before graph of a trace (networkx), to explain a race: which edge is missing."""

from __future__ import annotations

import networkx as nx

from overlapcheck.core.trace import HOST, Op, TraceView
from overlapcheck.invariants.races import Clocks


def hb_graph(trace: TraceView, upto: int | None = None) -> nx.DiGraph:
    """Ops as nodes (by seq); edges for program order, host issue, and event record -> wait."""
    ops = trace.ops[: None if upto is None else upto + 1]
    graph = nx.DiGraph()
    last: dict[str, int] = {}
    last_host = -1
    recorders: dict[int, int] = {}
    for op in ops:
        graph.add_node(op.seq, agent=op.agent, kind=op.kind, label=op.label, step=op.step)
        if op.agent in last:
            graph.add_edge(last[op.agent], op.seq, why="program order")
        if op.agent != HOST and last_host >= 0:
            graph.add_edge(last_host, op.seq, why="host issue")
        if op.waits is not None and op.waits in recorders:
            graph.add_edge(recorders[op.waits], op.seq, why=f"event e{op.waits}")
        if op.records is not None:
            recorders[op.records] = op.seq
        last[op.agent] = op.seq
        if op.agent == HOST:
            last_host = op.seq
    return graph


def ordered(trace: TraceView, first: int, second: int) -> bool:
    return bool(nx.has_path(hb_graph(trace, second), first, second))


def clock_ordered(clocks: Clocks, first: int, second: int) -> bool:
    """`ordered` from the vector clocks of a check that already advanced them past `second`
    (both ops with accesses): the same edges, without building the graph of the whole trace."""
    agent = clocks.agent[first]
    before, after = clocks.vc[first], clocks.vc[second]
    assert before is not None and after is not None
    return after[agent] >= before[agent]


def explain(trace: TraceView, first: Op, second: Op, clocks: Clocks | None = None) -> str:
    """A sentence naming the synchronisation that would have ordered the two operations
    (`clocks`, when given, say whether they are ordered: see `clock_ordered`)."""
    if (
        ordered(trace, first.seq, second.seq)
        if clocks is None
        else clock_ordered(clocks, first.seq, second.seq)
    ):
        return "the two operations are ordered (not a race)"
    where = f"`{first.label or first.kind}` on {first.agent} (step {first.step})"
    if second.agent == HOST:
        return f"the host did not wait on an event recorded on {first.agent} after {where}"
    if first.agent == HOST:
        return (
            f"{second.agent} ran `{second.label or second.kind}` with no wait ordering it after "
            f"the host's {first.kind} at step {first.step}"
        )
    return f"{second.agent} never waited on an event recorded on {first.agent} after {where}"


def race_subgraph(trace: TraceView, first: int, second: int) -> nx.DiGraph:
    """The happens-before graph around a race: the iterations of its two operations, with the two
    racing nodes marked and no path between them (write it with `nx.write_graphml`)."""
    graph = hb_graph(trace, second)
    low = trace.ops[first].step
    keep = [n for n, data in graph.nodes(data=True) if data["step"] >= low]
    sub = graph.subgraph(keep).copy()
    for seq, role in ((first, "first"), (second, "second")):
        if seq in sub:
            sub.nodes[seq]["race"] = role
    return sub
