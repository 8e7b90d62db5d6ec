"""Replay a mini-sglang counterexample on a real GPU with the race's order forced.

The simulator's run of the counterexample (mini-sglang's scheduler under the simulated CUDA)
shows the race: its first race by happens-before (`invariants/races.py`), two ops the scheduler
left unordered. The plan holds the one issued first until the one issued later has run, each
named as the simulated CUDA names it (iteration, stream, `aten_op @file:line function`,
ordinal): mini-sglang's own lines, the same on the GPU. Then each repeat runs mini-sglang's
scheduler on the GPU (`adapters/minisgl/cuda.py`), messages delivered at the recorded
iterations, and compares every request's tokens with the toy model run on the request alone:
a token that differs is the race, manifested.

A fix is another checkout of mini-sglang, and a process imports one: the plan is written as
JSON by the buggy checkout's process and read by the fixed one's
(`python -m overlapcheck.replay.minisgl_gpu FILE --plan PLAN.json --repeat N`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from overlapcheck.adapters.minisgl.cuda import CudaGate, CudaRun, Point, reference, unnumbered
from overlapcheck.backends.gates import OPENED, RELEASED, TIMED_OUT
from overlapcheck.core.trace import HOST, Op, TraceView
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.formats.counterexample import load as load_counterexample
from overlapcheck.invariants.hbgraph import clock_ordered
from overlapcheck.invariants.races import Clocks
from overlapcheck.replay.sim import replay_on_sim

_STATES = {OPENED: "forced", RELEASED: "released", TIMED_OUT: "timed out"}


@dataclass
class Plan:
    gates: list[CudaGate]
    deliveries: list[tuple[int, int, str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "gates": [g.to_json() for g in self.gates],
            "deliveries": [list(d) for d in self.deliveries],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Plan:
        return cls(
            [CudaGate.from_json(g) for g in raw["gates"]],
            [(int(a), int(b), str(c)) for a, b, c in raw["deliveries"]],
        )


def _point(ops: list[Op], seq: int) -> Point:
    op = ops[seq]
    label = unnumbered(op.label)
    ordinal = sum(
        1
        for other in ops[:seq]
        if other.step == op.step and other.agent == op.agent and unnumbered(other.label) == label
    )
    return Point(op.step, op.agent, label, ordinal)


def races(trace: TraceView) -> Iterator[tuple[Op, Op, str]]:
    """Pairs of the scheduler's own device ops (an aten call at a line of its code, not the
    stand-in forward: on the GPU that is many kernels) on two streams that touch a cell in
    common, one writing, unordered by happens-before; in issue order of the later one."""
    clocks = Clocks(trace)
    clocks.advance()
    ops = [op for op in trace.ops if op.accesses and op.agent != HOST and " @" in op.label]
    for j, second in enumerate(ops):
        for first in ops[:j]:
            if first.agent == second.agent or clock_ordered(clocks, first.seq, second.seq):
                continue
            for a in first.accesses:
                for b in second.accesses:
                    if a.buffer != b.buffer or "w" not in (a.mode + b.mode):
                        continue
                    if np.intersect1d(a.cells, b.cells).size:
                        kind = {"rw": "WAR", "wr": "RAW", "ww": "WAW"}[a.mode + b.mode]
                        yield first, second, f"{kind} on {a.buffer}"
                        break
                else:
                    continue
                break


def plan_from(trace: TraceView, deliveries: list[tuple[int, int, str]]) -> Plan:
    """A gate that forces the first race in `trace` between two of the scheduler's own device
    ops (see `races`), and the deliveries to replay."""
    ops = list(trace.ops)
    gates = [
        CudaGate(_point(ops, first.seq), _point(ops, second.seq), race)
        for first, second, race in itertools.islice(races(trace), 1)
    ]
    return Plan(gates, deliveries)


def without_graphs(cex: Counterexample) -> Counterexample:
    """The counterexample with CUDA graphs off: the GPU engine here captures none, so its plan
    is made from the simulator's run without them too."""
    if not cex.scenario.config.cuda_graph_bs:
        return cex
    data = json.loads(json.dumps(cex.data))
    data["scenario"]["config"].pop("cuda_graph_bs", None)
    return Counterexample(data, cex.where)


def plan_of(cex: Counterexample) -> Plan:
    """The plan from the simulator's run of `cex` (graphs off) with the loaded checkout."""
    sim = replay_on_sim(without_graphs(cex), keep_going=True)
    return plan_from(sim.trace, sim.deliveries)


def kept_plan(cex: Counterexample, path: Path) -> tuple[Plan, str]:
    """The plan kept beside the counterexample (made by the first GPU replay of it, from the
    code that failed), else a new one from the loaded checkout, then kept: a fix is replayed
    under the plan of the fault it fixes."""
    if path.is_file():
        return Plan.from_json(json.loads(path.read_text())), f"plan: {path} (kept)"
    plan = plan_of(cex)
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    return plan, f"plan: {path} (new, from this checkout's simulated run)"


@dataclass
class Repeat:
    index: int
    differing: list[int]  # uids whose tokens differ from the reference
    gates: list[str]  # what each gate did

    @property
    def manifested(self) -> bool:
        return bool(self.differing)

    def line(self) -> str:
        what = (
            f"tokens differ for {self.differing}" if self.differing else "tokens as the reference"
        )
        return f"repeat {self.index}: {what}; gates: {', '.join(self.gates) or 'none'}"


def replay(cex: Counterexample, plan: Plan, repeat: int, gated: bool = True) -> list[Repeat]:
    """`repeat` runs on the GPU after an unjudged warm-up without gates."""
    scenario = cex.scenario
    expected = reference(scenario.config, scenario.requests)
    CudaRun(scenario.config, scenario.requests, plan.deliveries).run()  # warm-up
    out = []
    for i in range(repeat):
        run = CudaRun(
            scenario.config, scenario.requests, plan.deliveries, plan.gates if gated else ()
        )
        tokens = run.run()
        differing = sorted(
            uid
            for uid, want in expected.items()
            if tokens.get(uid, [])[: len(want)] != want[: len(tokens.get(uid, []))]
        )
        gates = [
            f"{_STATES.get(state, 'not reached')} ({waited * 1e3:.2f} ms)"
            for state, waited in run.gate_results()
        ]
        out.append(Repeat(i, differing, gates))
    return out


def report(cex: Counterexample, path: Path, repeat: int) -> list[str]:
    """`replay FILE --backend cuda` of a mini-sglang counterexample: the lines it prints."""
    plan, said = kept_plan(cex, path)
    lines = [said]
    lines += [
        f"gate {i + 1}: step {g.held.step} {g.held.agent} `{g.held.label}` waits for step "
        f"{g.opener.step} {g.opener.agent} `{g.opener.label}` ({g.race})"
        for i, g in enumerate(plan.gates)
    ] or ["no race between the scheduler's own device ops: the repeats run without gates"]
    repeats = replay(without_graphs(cex), plan, repeat)
    lines += [r.line() for r in repeats]
    hit = sum(r.manifested for r in repeats)
    lines.append(
        f"manifested {hit}/{len(repeats)} (a token unlike the reference's), "
        f"clean {len(repeats) - hit}/{len(repeats)}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapcheck.replay.minisgl_gpu")
    p.add_argument("counterexample")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--plan", help="the plan's JSON file (default: FILE.cuda-plan.json)")
    args = p.parse_args(argv)
    cex = load_counterexample(args.counterexample)
    path = Path(args.plan or args.counterexample + PLAN_SUFFIX)
    for line in report(cex, path, args.repeat):
        print(line, flush=True)
    return 0


PLAN_SUFFIX = ".cuda-plan.json"

if __name__ == "__main__":
    sys.exit(main())
