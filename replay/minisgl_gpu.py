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

Name = tuple[int, str, str]  # (iteration, stream, label without its line)
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


def named_ops(trace: TraceView) -> list[Name]:
    """The scheduler's named device ops of a simulated run, in issue order, as the GPU
    runner names its calls (`GateMode.named`)."""
    return [
        (op.step, op.agent, unnumbered(op.label))
        for op in trace.ops
        if op.agent != HOST and " @" in op.label
    ]


def misaligned(plan: Plan, simulated: list[Name], on_gpu: list[Name]) -> str | None:
    """Where the GPU run issues one of the plan's labels at other (iteration, stream) places
    than the simulator's run of the same checkout: a gate there would hold or open another op
    than the planned one, so the run could show nothing. None when they line up."""
    labels = sorted({p.label for g in plan.gates for p in (g.held, g.opener)})
    for label in labels:
        want = [name[:2] for name in simulated if name[2] == label]
        got = [name[:2] for name in on_gpu if name[2] == label]
        if want != got:
            at = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            return (
                f"`{label}` issued {len(got)} times on the GPU, {len(want)} in the simulator "
                f"(first apart at its occurrence {at})"
            )
    return None


def simulated(cex: Counterexample) -> tuple[Plan, list[Name]]:
    """The plan from the simulator's run of `cex` (graphs off) with the loaded checkout, and
    that run's named device ops."""
    sim = replay_on_sim(without_graphs(cex), keep_going=True)
    return plan_from(sim.trace, sim.deliveries), named_ops(sim.trace)


def kept_plan(path: Path, fresh: Plan) -> tuple[Plan, str]:
    """The plan kept beside the counterexample (made by the first GPU replay of it, from the
    code that failed), else `fresh` (from the loaded checkout), then kept: a fix is replayed
    under the plan of the fault it fixes."""
    if path.is_file():
        return Plan.from_json(json.loads(path.read_text())), f"plan: {path} (kept)"
    path.write_text(json.dumps(fresh.to_json(), indent=1) + "\n")
    return fresh, f"plan: {path} (new, from this checkout's simulated run)"


@dataclass
class Repeat:
    index: int
    differing: list[int]  # uids whose tokens differ from the reference
    gates: list[str]  # what each gate did, as said
    states: list[int]  # and as the spin reported it

    @property
    def manifested(self) -> bool:
        return bool(self.differing)

    def line(self) -> str:
        what = (
            f"tokens differ for {self.differing}" if self.differing else "tokens as the reference"
        )
        return f"repeat {self.index}: {what}; gates: {', '.join(self.gates) or 'none'}"


def replay(
    cex: Counterexample, plan: Plan, repeat: int, expected_names: list[Name] | None = None
) -> tuple[list[Repeat], str | None]:
    """`repeat` runs on the GPU after an unjudged warm-up without gates; the warm-up's named
    calls are checked against `expected_names` first (a misfit: no repeat runs)."""
    scenario = cex.scenario
    expected = reference(scenario.config, scenario.requests)
    warm = CudaRun(
        scenario.config, scenario.requests, plan.deliveries, record_names=expected_names is not None
    )
    warm.run()
    if expected_names is not None:
        misfit = misaligned(plan, expected_names, warm.mode.named or [])
        if misfit is not None:
            return [], misfit
    out = []
    for i in range(repeat):
        run = CudaRun(scenario.config, scenario.requests, plan.deliveries, plan.gates)
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
        out.append(Repeat(i, differing, gates, [state for state, _ in run.gate_results()]))
    return out, None


def report(cex: Counterexample, path: Path, repeat: int) -> tuple[list[str], str]:
    """`replay FILE --backend cuda` of a mini-sglang counterexample: the lines it prints and
    the verdict (`reproduced`, `fixed`, or `differs` when the order could not be forced)."""
    fresh, names = simulated(cex)
    plan, said = kept_plan(path, fresh)
    lines = [said]
    lines += [
        f"gate {i + 1}: step {g.held.step} {g.held.agent} `{g.held.label}` waits for step "
        f"{g.opener.step} {g.opener.agent} `{g.opener.label}` ({g.race})"
        for i, g in enumerate(plan.gates)
    ] or ["no race between the scheduler's own device ops: the repeats run without gates"]
    repeats, misfit = replay(without_graphs(cex), plan, repeat, names)
    if misfit is not None:
        lines.append(
            f"NOT RUN: the GPU run does not issue the plan's ops as the simulator's run of this "
            f"checkout does: {misfit}; a gate would hold or open another op (a bug of "
            f"overlapcheck's GPU runner)"
        )
        return lines, "differs"
    lines += [r.line() for r in repeats]
    hit = sum(r.manifested for r in repeats)
    forced = sum(all(s == OPENED for s in r.states) and bool(r.states) for r in repeats)
    lines.append(
        f"manifested {hit}/{len(repeats)} (a token unlike the reference's), "
        f"clean {len(repeats) - hit}/{len(repeats)}"
        + (f"; the racy order forced in {forced}/{len(repeats)}" if plan.gates else "")
    )
    if hit:
        return lines, "reproduced"
    waited = sum(bool(r.states) and all(s == TIMED_OUT for s in r.states) for r in repeats)
    if plan.gates and forced:
        # the order was forced and the tokens still right: the race does not reach an output
        lines.append("the racy order ran and every token is right: it does not reach an output")
    elif plan.gates and waited == len(repeats):
        lines.append(
            "the racy order could not happen in any repeat (each gate waited out its bound: "
            "the opener comes after the held op): the fix holds"
        )
    return lines, "fixed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapcheck.replay.minisgl_gpu")
    p.add_argument("counterexample")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--plan", help="the plan's JSON file (default: FILE.cuda-plan.json)")
    args = p.parse_args(argv)
    cex = load_counterexample(args.counterexample)
    path = Path(args.plan or args.counterexample + PLAN_SUFFIX)
    lines, verdict = report(cex, path, args.repeat)
    for line in lines:
        print(line, flush=True)
    return VERDICT_EXIT[verdict]


# as `replay`'s exit status (the README's table): 1 it reproduced, 0 clean, 4 not forced
VERDICT_EXIT = {"reproduced": 1, "fixed": 0, "differs": 4}


PLAN_SUFFIX = ".cuda-plan.json"

if __name__ == "__main__":
    sys.exit(main())
