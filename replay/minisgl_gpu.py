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
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import numpy as np

from overlapcheck.adapters.minisgl.cuda import CudaGate, CudaRun, Point, reference, unnumbered
from overlapcheck.backends import gate_record
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


@dataclass
class Simulated:
    """The simulator's run of a counterexample with the loaded checkout: the plan it gives,
    its named device ops, and every pair of points it found racing."""

    plan: Plan
    names: list[Name]
    racing: set[tuple[Point, Point]]


def simulated(cex: Counterexample) -> Simulated:
    sim = replay_on_sim(without_graphs(cex), keep_going=True)
    ops = list(sim.trace.ops)
    racing = {(_point(ops, a.seq), _point(ops, b.seq)) for a, b, _ in races(sim.trace)}
    return Simulated(plan_from(sim.trace, sim.deliveries), named_ops(sim.trace), racing)


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
    crash: str | None = None  # the device's error when the run failed (an index out of bounds)

    @property
    def manifested(self) -> bool:
        return bool(self.differing) or self.crash is not None

    def line(self) -> str:
        if self.crash is not None and not self.states:
            # the record was not readable (in device memory, which a stopped context cannot
            # read, where CUDA would not map the record file) or not written yet
            return (
                f"repeat {self.index}: the GPU run failed: {self.crash}; gates: not known (the "
                "device stopped the run before they could be read)"
            )
        if self.crash is not None:
            return f"repeat {self.index}: the GPU run failed: {self.crash}; gates: " + ", ".join(
                self.gates
            )
        what = "tokens as the reference"
        if self.differing:
            what = f"tokens differ for {self.differing}"
        return f"repeat {self.index}: {what}; gates: {', '.join(self.gates) or 'none'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "differing": self.differing,
            "gates": self.gates,
            "states": self.states,
            "crash": self.crash,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Repeat:
        return cls(
            int(raw["index"]),
            [int(u) for u in raw["differing"]],
            [str(g) for g in raw["gates"]],
            [int(s) for s in raw["states"]],
            None if raw.get("crash") is None else str(raw["crash"]),
        )


def one_repeat(cex: Counterexample, plan: Plan, index: int, record: Path | None = None) -> Repeat:
    """One gated run on the GPU, judged against the reference. A run the device stops (a
    device-side assert: the racy order put an index out of bounds) is the race, manifested;
    the process's CUDA context is then unusable (`gated_repeats` goes on in a new process).
    The gates write their record into `record`'s mapped pages when given: a stopped run's
    gates are then read from there."""
    scenario = cex.scenario
    expected = reference(scenario.config, scenario.requests)
    run = CudaRun(
        scenario.config,
        scenario.requests,
        plan.deliveries,
        plan.gates,
        gate_record=None if record is None else (record, index),
    )
    _fresh_allocator()
    try:
        tokens = run.run()
    except RuntimeError as err:  # torch.AcceleratorError is one
        said = device_error(str(err))
        if said is None:
            raise  # not the device's doing: never counted as the race
        return crashed(index, said, plan, record)
    differing = sorted(
        uid
        for uid, want in expected.items()
        if tokens.get(uid, [])[: len(want)] != want[: len(tokens.get(uid, []))]
    )
    results = run.gate_results()
    return Repeat(index, differing, _said(results), [state for state, _ in results])


def _said(results: list[tuple[int, float]]) -> list[str]:
    return [
        f"{_STATES.get(state, 'not reached')} ({waited * 1e3:.2f} ms)" for state, waited in results
    ]


def crashed(index: int, error: str, plan: Plan, record: Path | None) -> Repeat:
    """Repeat `index`, stopped by the device: its gates as their record file kept them (read
    with no CUDA call: the context is dead, the process may be too), else not known."""
    results = None
    if record is not None and plan.gates:
        results = gate_record.read(record, len(plan.gates), index)
    if results is None:
        return Repeat(index, [], [], [], crash=error)
    return Repeat(index, [], _said(results), [state for state, _ in results], crash=error)


def record_file(plan_file: Path) -> Path:
    """The gates' record file of the repeats processes of the plan in `plan_file` (beside it:
    `gated_repeats` puts both in shared memory where it can, `gate_record.shared_dir`)."""
    return plan_file.with_name(plan_file.name + ".gates")


def _fresh_allocator() -> None:
    """The caching allocator as a new process has it: the simulator's run that made the plan
    started from an empty one, and which freed block an allocation reuses is the race."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


# What a process's stderr says when the device stopped a run: a device-side assert (an index
# out of bounds) or a fault; anything else that kills a repeat's process is not the race's doing.
# Only what a kernel's own access can cause counts: another CUDA error (an invalid argument to
# an API call, out of memory) is not the racy order's doing, and torch's advice line "Compile
# with `TORCH_USE_CUDA_DSA` to enable device-side assertions" follows every CUDA error.
_DEVICE_ERRORS = (
    "Assertion `",
    "device-side assert triggered",
    "an illegal memory access",
    "an illegal instruction",
    "misaligned address",
    "unspecified launch failure",
)


def device_error(stderr: str) -> str | None:
    """The line that says how the device stopped a run (the kernel's assertion first), or None
    when the output shows no device error."""
    lines = [line.strip() for line in stderr.splitlines() if "TORCH_USE_CUDA_DSA" not in line]
    for marker in _DEVICE_ERRORS:
        found = next((line for line in lines if marker in line), None)
        if found is not None:
            return found.split("/")[-1] if "Assertion `" in found else found
    return None


@dataclass
class ChildRun:
    """What a process running repeats `start`.. gave back: a JSON line per repeat it finished,
    its exit status (None: it stopped answering, or could not be reaped) and its other output."""

    lines: list[str]
    returncode: int | None
    stderr: str
    silent: bool = False  # killed after `_SILENCE` seconds without a line


# A repeats process's line after its warm-up without gates ran clean (its first repeat's index).
WARM_LINE = "warm"
_DEAD_CONTEXT_GRACE = 20.0  # seconds a process whose run the device stopped may take to exit
# seconds a repeats process may go without a line (its imports and warm-up come first): past
# them it is stuck (a device a killed process still holds, say), and nothing more is judged
_SILENCE = 240.0


def _child(
    cex_file: Path, plan_file: Path, start: int, repeat: int, on_line: Callable[[str], None]
) -> ChildRun:
    """Repeats `start`.. in a new process, each repeat's JSON line handed to `on_line` as it
    comes (a replay shows its progress; a cut run keeps what it had)."""
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    command = [sys.executable, "-m", __name__, str(cex_file), "--plan", str(plan_file)]
    command += [
        "--from",
        str(start),
        "--repeat",
        str(repeat),
        "--record",
        str(record_file(plan_file)),
    ]
    return read_repeats(command, env, on_line)


def read_repeats(
    command: list[str], env: dict[str, str], on_line: Callable[[str], None]
) -> ChildRun:
    """Run `command` (a repeats process, in a session of its own), each JSON line of its output
    to `on_line` as it comes. Past its crash line it has `_DEAD_CONTEXT_GRACE` seconds to end;
    then it and anything it started are killed and nothing more is read or waited for: a
    process on a dead CUDA context can block in the driver's teardown, where even a kill waits
    and the pipe stays open (seen on an H200: the replay hung to its timeout). One silent for
    `_SILENCE` seconds is killed the same way."""
    lines: list[str] = []
    other: list[str] = []  # a kernel's assertion is printed by the device on stdout
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    queue: Queue[str | None] = Queue()
    threading.Thread(target=_pump, args=(proc.stdout, queue), daemon=True).start()
    deadline: float | None = None  # set by a crash line
    silent = False
    while True:
        wait = _SILENCE if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            raw = queue.get(timeout=wait)
        except Empty:
            silent = deadline is None
            _kill_group(proc)
            break
        if raw is None:  # its output ended
            break
        line = raw.rstrip("\n")
        if not line.startswith("{"):
            other.append(line)
            continue
        lines.append(line)
        on_line(line)
        if deadline is None and json.loads(line).get("crash") is not None:
            deadline = time.monotonic() + _DEAD_CONTEXT_GRACE
    try:
        code: int | None = proc.wait(timeout=_DEAD_CONTEXT_GRACE if deadline is None else 5.0)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            code = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None  # blocked in the driver: left behind
    return ChildRun(lines, code, "\n".join(other), silent)


def _pump(stream: Any, queue: Queue[str | None]) -> None:
    for raw in stream:
        queue.put(raw)
    queue.put(None)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def gated_repeats(
    cex: Counterexample,
    plan: Plan,
    repeat: int,
    on_repeat: Callable[[Repeat], None] = lambda repeat: None,
) -> tuple[list[Repeat], str | None]:
    """The gated repeats, in processes of their own: a device-side assert leaves a process's
    CUDA context dead, and PyTorch may then abort the process outright (an event's destructor
    throws), so the repeat it stopped is the race manifested and the next process goes on from
    the repeat after it. A process that dies with no device error in its output is not the
    race's doing: nothing is judged then (the second value says why)."""
    out: list[Repeat] = []

    def finished(repeat: Repeat) -> None:
        out.append(repeat)
        on_repeat(repeat)

    warmed: list[int] = []  # the first repeat of each process whose warm-up ran clean

    def said(line: str) -> None:
        raw = json.loads(line)
        if WARM_LINE in raw:
            warmed.append(int(raw[WARM_LINE]))
        else:
            finished(Repeat.from_json(raw))

    with tempfile.TemporaryDirectory(dir=gate_record.shared_dir()) as tmp:
        cex_file, plan_file = Path(tmp, "cex.json"), Path(tmp, "plan.json")
        cex_file.write_text(json.dumps(cex.data))
        plan_file.write_text(json.dumps(plan.to_json()))
        while len(out) < repeat:
            start = len(out)
            child = _child(cex_file, plan_file, start, repeat, said)
            if len(out) >= repeat or (len(out) > start and out[-1].crash is not None):
                continue  # done, or it said which repeat the device stopped (judged by its
                # own lines: an earlier process's crash line says nothing of this one)
            if child.silent:
                return out, (
                    f"a repeat's process said nothing for {_SILENCE:.0f} s after repeat "
                    f"{len(out)} began (the device left stuck?)"
                )
            error = device_error(child.stderr)
            if error is None:
                tail = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
                return out, f"a repeat's process failed without a device error ({tail})"
            if start not in warmed:
                # Its run without gates failed: no gate was set, so nothing says the racy
                # order did it (as when the replay's own warm-up fails).
                return out, (
                    f"the warm-up without gates failed on the device in repeat {start}'s "
                    f"process ({error})"
                )
            finished(crashed(len(out), error, plan, record_file(plan_file)))
    return out, None


def replay(
    cex: Counterexample,
    plan: Plan,
    repeat: int,
    expected_names: list[Name] | None = None,
    on_repeat: Callable[[Repeat], None] = lambda repeat: None,
) -> tuple[list[Repeat], str | None]:
    """`repeat` runs on the GPU after an unjudged warm-up without gates in this process; the
    warm-up's named calls are checked against `expected_names` first (a misfit: no repeat
    runs), then the gated repeats run in processes of their own (`gated_repeats`)."""
    scenario = cex.scenario
    warm = CudaRun(
        scenario.config, scenario.requests, plan.deliveries, record_names=expected_names is not None
    )
    _fresh_allocator()
    try:
        warm.run()
    except RuntimeError as err:
        return [], f"the warm-up without gates failed on the device ({_first_line(err)})"
    if expected_names is not None:
        misfit = misaligned(plan, expected_names, warm.mode.named or [])
        if misfit is not None:
            return [], (
                f"the GPU run does not issue the plan's ops as the simulator's run of this "
                f"checkout does: {misfit}; a gate would hold or open another op (a bug of "
                f"overlapcheck's GPU runner)"
            )
    return gated_repeats(cex, plan, repeat, on_repeat)


def report(
    cex: Counterexample, path: Path, repeat: int, say: Callable[[str], None] = lambda line: None
) -> tuple[list[str], str]:
    """`replay FILE --backend cuda` of a mini-sglang counterexample: the lines it prints, each
    also handed to `say` as soon as it is known, and the verdict (`reproduced`, `fixed`, or
    `differs` when nothing could be judged)."""
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        say(line)

    now = simulated(cex)
    plan, said = kept_plan(path, now.plan)
    emit(said)
    for line in [
        f"gate {i + 1}: step {g.held.step} {g.held.agent} `{g.held.label}` waits for step "
        f"{g.opener.step} {g.opener.agent} `{g.opener.label}` ({g.race})"
        for i, g in enumerate(plan.gates)
    ] or ["no race between the scheduler's own device ops: the repeats run without gates"]:
        emit(line)
    repeats, misfit = replay(without_graphs(cex), plan, repeat, now.names, lambda r: emit(r.line()))
    if misfit is not None:
        emit(f"NOT JUDGED: {misfit}")
        return lines, "differs"
    hit = sum(r.manifested for r in repeats)
    forced = sum(all(s == OPENED for s in r.states) and bool(r.states) for r in repeats)
    unread = sum(r.crash is not None and not r.states for r in repeats)
    emit(
        f"manifested {hit}/{len(repeats)} (a token unlike the reference's, or the device "
        f"stopped the run), "
        f"clean {len(repeats) - hit}/{len(repeats)}"
        + (f"; the racy order forced in {forced}/{len(repeats)}" if plan.gates else "")
        + (
            f", not known in {unread} (the device stopped the run; each process's run without "
            "gates before it ran clean)"
            if plan.gates and unread
            else ""
        )
    )
    if hit:
        return lines, "reproduced"
    waited = sum(bool(r.states) and all(s == TIMED_OUT for s in r.states) for r in repeats)
    apart = [g for g in plan.gates if (g.held, g.opener) not in now.racing]
    if plan.gates and forced and len(apart) == len(plan.gates):
        emit(
            "the planned order ran and every token is right: with this code the two ops share "
            "no memory (the simulator's run of it finds no race between them): the fix holds"
        )
    elif plan.gates and forced:
        # the order was forced and the tokens still right: the race does not reach an output
        emit("the racy order ran and every token is right: it reaches no output here")
    elif plan.gates and waited == len(repeats):
        emit(
            "the racy order could not happen in any repeat (each gate waited out its bound: "
            "the opener comes after the held op): the fix holds"
        )
    return lines, "fixed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapcheck.replay.minisgl_gpu")
    p.add_argument("counterexample")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--plan", help="the plan's JSON file (default: FILE.cuda-plan.json)")
    p.add_argument("--from", dest="start", type=int, help=argparse.SUPPRESS)  # gated_repeats
    p.add_argument("--record", type=Path, help=argparse.SUPPRESS)  # the gates' record file
    args = p.parse_args(argv)
    cex = load_counterexample(args.counterexample)
    path = Path(args.plan or args.counterexample + PLAN_SUFFIX)
    if args.start is not None:  # gated_repeats' process: a JSON line per repeat
        plan = Plan.from_json(json.loads(path.read_text()))
        # unjudged, without gates: CUDA loads a kernel's module at its first launch, which
        # would wait behind a held spin, so a process's first gated run could force nothing
        CudaRun(cex.scenario.config, cex.scenario.requests, plan.deliveries).run()
        print(json.dumps({WARM_LINE: args.start}), flush=True)  # a crash after it is gated
        for index in range(args.start, args.repeat):
            repeat = one_repeat(without_graphs(cex), plan, index, args.record)
            print(json.dumps(repeat.to_json()), flush=True)
            if repeat.crash is not None:
                # The CUDA context is dead: the next process goes on. Out at once, past the
                # interpreter's teardown, whose CUDA frees and destructors can block for good
                # on a dead context (seen on an H200: the replay then hung to its timeout).
                # Its output closed first: an exit that blocks in the driver keeps it open.
                sys.stdout.flush()
                sys.stderr.flush()
                os.close(1)
                os.close(2)
                os._exit(3)
        return 0
    _, verdict = report(cex, path, args.repeat, lambda line: print(line, flush=True))
    return VERDICT_EXIT[verdict]


# as `replay`'s exit status (the README's table): 1 it reproduced, 0 clean, 4 not forced
VERDICT_EXIT = {"reproduced": 1, "fixed": 0, "differs": 4}


PLAN_SUFFIX = ".cuda-plan.json"

if __name__ == "__main__":
    sys.exit(main())
