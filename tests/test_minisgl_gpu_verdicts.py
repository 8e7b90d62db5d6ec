"""How a GPU replay of a mini-sglang counterexample judges its repeats (`replay/minisgl_gpu.py`),
with the GPU runs stood in for: a device error is the race manifested and a new process goes on
after it; a fix is told apart from a race that reached no output; a plan that does
not line up runs nothing and says so."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from overlapcheck.adapters.minisgl.cuda import CudaGate, Point
from overlapcheck.backends import gate_record
from overlapcheck.backends.gates import OPENED, TIMED_OUT
from overlapcheck.replay import minisgl_gpu
from overlapcheck.replay.minisgl_gpu import Plan, Repeat, Simulated

HELD = Point(0, "engine", "index_put_ @scheduler.py _forward", 0)
OPENER = Point(2, "scheduler", "h2d @scheduler.py _make_write_tuple", 1)
PLAN = Plan([CudaGate(HELD, OPENER, "WAR on m")], [(0, 0, "user")])
NAMES = [(0, "engine", HELD.label), (2, "scheduler", OPENER.label), (2, "scheduler", OPENER.label)]


class _Cex:
    def __init__(self) -> None:
        self.scenario: Any = type("S", (), {"config": None, "requests": ()})()
        self.data: dict[str, Any] = {}


class _Warm:
    def __init__(self, *args: Any, record_names: bool = False, **kwargs: Any) -> None:
        self.mode = type("M", (), {"named": list(NAMES)})()

    def run(self) -> dict[int, list[int]]:
        return {}


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(minisgl_gpu, "CudaRun", _Warm)
    monkeypatch.setattr(minisgl_gpu, "_fresh_allocator", lambda: None)
    monkeypatch.setattr(minisgl_gpu, "without_graphs", lambda cex: cex)
    return calls


ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0] "
    'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
    "terminate called after throwing an instance of 'c10::AcceleratorError'\n"
)


def _line(i: int) -> str:
    return json.dumps(Repeat(i, [], ["forced (1.00 ms)"], [OPENED]).to_json())


def _warm(start: int) -> str:
    """A repeats process's line once its warm-up without gates ran clean."""
    return json.dumps({minisgl_gpu.WARM_LINE: start})


def test_a_process_the_device_aborts_is_the_race_and_the_next_goes_on(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first process finishes repeats 0 and 1, then the device's assert aborts it in repeat
    2 (no line for it); a new process goes on from repeat 3."""

    def child(
        cex_file: Path, plan_file: Path, start: int, repeat: int, on_line: Callable[[str], None]
    ) -> minisgl_gpu.ChildRun:
        stand_ins.append(("child", start))
        lines = [_line(0), _line(1)] if start == 0 else [_line(i) for i in range(start, repeat)]
        lines.insert(0, _warm(start))
        for line in lines:
            on_line(line)
        return minisgl_gpu.ChildRun(lines, -6 if start == 0 else 0, ASSERT if start == 0 else "")

    monkeypatch.setattr(minisgl_gpu, "_child", child)
    seen: list[int] = []
    repeats, misfit = minisgl_gpu.replay(
        _Cex(),  # type: ignore[arg-type]
        PLAN,
        5,
        NAMES,
        lambda r: seen.append(r.index),
    )
    assert misfit is None and stand_ins == [("child", 0), ("child", 3)]
    assert seen == [0, 1, 2, 3, 4]  # each repeat said as it ended
    assert [r.manifested for r in repeats] == [False, False, True, False, False]
    assert "index out of bounds" in repeats[2].line() and repeats[2].index == 2


def test_a_process_aborted_before_its_line_after_one_that_said_its_crash_goes_on(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeat 0's process says its crash; repeat 1's is aborted by the device before its line
    (its output shows the assert): repeat 1 manifested, and the next process starts at 2. (Seen
    on an H200: the first process's crash line was taken for the second's, which was started
    again at 1 until the step's time ran out.)"""
    crash0 = json.dumps(minisgl_gpu.Repeat(0, [], [], [], crash=ASSERT).to_json())

    def child(
        cex_file: Path, plan_file: Path, start: int, repeat: int, on_line: Callable[[str], None]
    ) -> minisgl_gpu.ChildRun:
        assert ("child", start) not in stand_ins, f"repeat {start}'s process started again"
        stand_ins.append(("child", start))
        on_line(_warm(start))
        if start == 0:
            on_line(crash0)
            return minisgl_gpu.ChildRun([_warm(0), crash0], 3, "")
        if start == 1:
            return minisgl_gpu.ChildRun([_warm(1)], -6, ASSERT)
        lines = [_line(i) for i in range(start, repeat)]
        for line in lines:
            on_line(line)
        return minisgl_gpu.ChildRun(lines, 0, "")

    monkeypatch.setattr(minisgl_gpu, "_child", child)
    out, unjudged = minisgl_gpu.gated_repeats(_Cex(), PLAN, 4)  # type: ignore[arg-type]
    assert unjudged is None and stand_ins == [("child", 0), ("child", 1), ("child", 2)]
    assert [r.index for r in out] == [0, 1, 2, 3]
    assert [r.crash is not None for r in out] == [True, True, False, False]


def test_a_process_the_device_aborts_in_its_run_without_gates_is_not_judged(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeat 0's process warms up clean, says repeat 0 and is aborted by the device in repeat
    1 (manifested); repeat 2's process is aborted before its warm-up without gates said it ran
    clean: no gate was set, so the racy order is not what stopped it, and nothing more is
    judged (as when the replay's own warm-up fails)."""

    def child(
        cex_file: Path, plan_file: Path, start: int, repeat: int, on_line: Callable[[str], None]
    ) -> minisgl_gpu.ChildRun:
        stand_ins.append(("child", start))
        if start == 0:
            for line in (_warm(0), _line(0)):
                on_line(line)
            return minisgl_gpu.ChildRun([_warm(0), _line(0)], -6, ASSERT)
        return minisgl_gpu.ChildRun([], -6, ASSERT)

    monkeypatch.setattr(minisgl_gpu, "_child", child)
    out, unjudged = minisgl_gpu.gated_repeats(_Cex(), PLAN, 4)  # type: ignore[arg-type]
    assert stand_ins == [("child", 0), ("child", 2)]
    assert [r.index for r in out] == [0, 1] and [r.crash is None for r in out] == [True, False]
    assert unjudged is not None
    assert "warm-up without gates failed on the device in repeat 2's process" in unjudged
    assert "index out of bounds" in unjudged


def test_a_crashed_repeat_says_its_gates_are_not_known(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The spin's record of a gate lies in device memory, which a stopped run cannot read: the
    line and the summary say so, never 'gates: none' or a bare 'forced in 0/2'."""
    monkeypatch.setattr(minisgl_gpu, "simulated", lambda cex: Simulated(PLAN, NAMES, set()))
    monkeypatch.setattr(minisgl_gpu, "without_graphs", lambda cex: cex)
    repeats = [Repeat(0, [], [], [], crash="Assertion `index`"), Repeat(1, [1], ["x"], [OPENED])]
    monkeypatch.setattr(minisgl_gpu, "replay", lambda *a: (repeats, None))
    lines, got = minisgl_gpu.report(_Cex(), tmp_path / "plan.json", 2)  # type: ignore[arg-type]
    assert got == "reproduced"
    assert "gates: not known" in repeats[0].line() and "none" not in repeats[0].line()
    assert "forced in 1/2, not known in 1 (the device stopped the run" in lines[-1]


def _record(plan_file: Path, repeat: int, states: list[int]) -> None:
    """A gates' record as a repeat's spins leave it in the record file's mapped pages."""
    path = minisgl_gpu.record_file(plan_file)
    gate_record.start(path, len(states), repeat)
    values = np.frombuffer(path.read_bytes(), dtype=np.int64).copy()
    n = len(states)
    values[gate_record.states(n)][:n] = states
    values[gate_record.waits(n)][:n] = 1_500_000  # 1.5 ms waited each
    path.write_bytes(values.tobytes())


def test_a_process_the_device_aborts_leaves_its_gates_in_the_record_file(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeat 1's process is aborted by the device before its line; its spin had written
    'opened' into the record file's pages first: the parent reads it there, and the repeat
    says its gate was forced. Repeat 2's record is another repeat's (its process died before
    its gates began): not known, never a stale record read as this repeat's."""

    def child(
        cex_file: Path, plan_file: Path, start: int, repeat: int, on_line: Callable[[str], None]
    ) -> minisgl_gpu.ChildRun:
        stand_ins.append(("child", start))
        on_line(_warm(start))
        if start == 0:
            on_line(_line(0))
            _record(plan_file, 1, [OPENED])
            return minisgl_gpu.ChildRun([_warm(0), _line(0)], -6, ASSERT)
        if start == 2:
            return minisgl_gpu.ChildRun([_warm(2)], -6, ASSERT)  # repeat 1's record still there
        lines = [_line(i) for i in range(start, repeat)]
        for line in lines:
            on_line(line)
        return minisgl_gpu.ChildRun([_warm(start), *lines], 0, "")

    monkeypatch.setattr(minisgl_gpu, "_child", child)
    out, unjudged = minisgl_gpu.gated_repeats(_Cex(), PLAN, 4)  # type: ignore[arg-type]
    assert unjudged is None and [r.index for r in out] == [0, 1, 2, 3]
    assert out[1].crash is not None and out[1].states == [OPENED]
    assert out[1].line().endswith("gates: forced (1.50 ms)")
    assert out[2].crash is not None and out[2].states == []
    assert "gates: not known" in out[2].line()


def test_a_crashed_repeat_read_from_its_record_counts_as_forced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(minisgl_gpu, "simulated", lambda cex: Simulated(PLAN, NAMES, set()))
    monkeypatch.setattr(minisgl_gpu, "without_graphs", lambda cex: cex)
    repeats = [
        Repeat(0, [], ["forced (1.00 ms)"], [OPENED], crash="Assertion `index`"),
        Repeat(1, [], [], [], crash="Assertion `index`"),
    ]
    monkeypatch.setattr(minisgl_gpu, "replay", lambda *a: (repeats, None))
    lines, got = minisgl_gpu.report(_Cex(), tmp_path / "plan.json", 2)  # type: ignore[arg-type]
    assert got == "reproduced"
    assert "the racy order forced in 1/2, not known in 1 (" in lines[-1]


def test_a_repeat_run_in_process_reads_its_record_after_the_device_stops_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`one_repeat`: the run raises the device's error; the gates' record comes from the file,
    with no CUDA call (the context is dead)."""
    record = tmp_path / "plan.json.gates"

    class _Stopped:
        def __init__(self, *args: Any, gate_record: tuple[Path, int] | None = None) -> None:
            assert gate_record == (record, 3)

        def run(self) -> dict[int, list[int]]:
            _record(tmp_path / "plan.json", 3, [TIMED_OUT])
            raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(minisgl_gpu, "CudaRun", _Stopped)
    monkeypatch.setattr(minisgl_gpu, "reference", lambda *a: {})
    monkeypatch.setattr(minisgl_gpu, "_fresh_allocator", lambda: None)
    got = minisgl_gpu.one_repeat(_Cex(), PLAN, 3, record)  # type: ignore[arg-type]
    assert got.crash is not None and got.states == [TIMED_OUT]
    assert got.gates == ["timed out (1.50 ms)"]


def test_a_process_that_dies_without_a_device_error_is_not_judged(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeat's process that fails for another reason (an import, a bug of ours) is never
    counted as the race: a wrong 'reproduced' would blame the user."""
    gone = minisgl_gpu.ChildRun([], 1, "ModuleNotFoundError: No module named 'minisgl'\n")
    monkeypatch.setattr(minisgl_gpu, "_child", lambda *a: gone)
    repeats, misfit = minisgl_gpu.replay(_Cex(), PLAN, 5, NAMES)  # type: ignore[arg-type]
    assert repeats == [] and misfit is not None and "No module named" in misfit


def test_a_plan_that_does_not_line_up_runs_no_repeat(stand_ins: list[tuple[str, int]]) -> None:
    repeats, misfit = minisgl_gpu.replay(_Cex(), PLAN, 3, NAMES[:2])  # type: ignore[arg-type]
    assert repeats == [] and misfit is not None and "h2d @scheduler.py _make_write_tuple" in misfit


def test_a_repeat_travels_from_a_fresh_process_as_json() -> None:
    repeat = Repeat(4, [1], ["forced (2.00 ms)"], [OPENED], crash=None)
    assert Repeat.from_json(repeat.to_json()) == repeat


@pytest.mark.parametrize(
    ("states", "racing", "said", "verdict"),
    [
        ([OPENED], {(HELD, OPENER)}, "it reaches no output here", "fixed"),
        ([OPENED], set(), "share no memory", "fixed"),
        ([TIMED_OUT], {(HELD, OPENER)}, "could not happen in any repeat", "fixed"),
    ],
)
def test_clean_repeats_say_why(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    states: list[int],
    racing: set[tuple[Point, Point]],
    said: str,
    verdict: str,
) -> None:
    monkeypatch.setattr(minisgl_gpu, "simulated", lambda cex: Simulated(PLAN, NAMES, racing))
    monkeypatch.setattr(minisgl_gpu, "without_graphs", lambda cex: cex)
    clean = [Repeat(i, [], ["x"], list(states)) for i in range(2)]
    monkeypatch.setattr(minisgl_gpu, "replay", lambda *a: (clean, None))
    lines, got = minisgl_gpu.report(_Cex(), tmp_path / "plan.json", 2)  # type: ignore[arg-type]
    assert got == verdict and any(said in line for line in lines), lines
    assert "clean 2/2" in lines[-2]


def test_a_manifested_repeat_is_reproduced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(minisgl_gpu, "simulated", lambda cex: Simulated(PLAN, NAMES, set()))
    monkeypatch.setattr(minisgl_gpu, "without_graphs", lambda cex: cex)
    repeats = [Repeat(0, [1], ["forced (1 ms)"], [OPENED]), Repeat(1, [], ["x"], [OPENED])]
    monkeypatch.setattr(minisgl_gpu, "replay", lambda *a: (repeats, None))
    lines, got = minisgl_gpu.report(_Cex(), tmp_path / "plan.json", 2)  # type: ignore[arg-type]
    assert got == "reproduced" and "manifested 1/2" in lines[-1]
    assert minisgl_gpu.VERDICT_EXIT[got] == 1


def test_only_a_device_error_in_a_run_counts_as_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(_Warm):
        message = ""

        def run(self) -> dict[int, list[int]]:
            raise RuntimeError(self.message)

    monkeypatch.setattr(minisgl_gpu, "_fresh_allocator", lambda: None)
    monkeypatch.setattr(minisgl_gpu, "CudaRun", Failing)
    Failing.message = "CUDA error: device-side assert triggered"
    assert minisgl_gpu.one_repeat(_Cex(), PLAN, 0).crash == Failing.message  # type: ignore[arg-type]
    Failing.message = "a bug of ours"
    with pytest.raises(RuntimeError, match="a bug of ours"):
        minisgl_gpu.one_repeat(_Cex(), PLAN, 0)  # type: ignore[arg-type]
    # Another CUDA error is not the racy order's doing, though torch's advice after every one
    # speaks of device-side assertions (seen on an H100: a failed host registration)
    Failing.message = (
        "CUDA error: invalid argument\nCUDA kernel errors might be asynchronously reported at "
        "some other API call\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
    )
    with pytest.raises(RuntimeError, match="invalid argument"):
        minisgl_gpu.one_repeat(_Cex(), PLAN, 0)  # type: ignore[arg-type]


def test_a_process_stuck_after_its_crash_line_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its teardown blocked on the dead CUDA context (seen on an H200): killed after the grace,
    what it said kept."""
    monkeypatch.setattr(minisgl_gpu, "_DEAD_CONTEXT_GRACE", 0.5)
    crash = json.dumps(minisgl_gpu.Repeat(0, [], [], [], crash="Assertion `index`").to_json())
    stuck = f"import time; print({crash!r}, flush=True); time.sleep(120)"
    seen: list[str] = []
    started = time.monotonic()
    child = minisgl_gpu.read_repeats([sys.executable, "-c", stuck], dict(os.environ), seen.append)
    assert time.monotonic() - started < 60
    assert child.lines == seen == [crash] and child.returncode != 0


def test_a_process_whose_output_outlives_its_kill_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What it started keeps the pipe open after the process is killed (as a process blocked in
    the driver's teardown does): the whole session is killed and nothing more is read."""
    monkeypatch.setattr(minisgl_gpu, "_DEAD_CONTEXT_GRACE", 0.5)
    crash = json.dumps(minisgl_gpu.Repeat(0, [], [], [], crash="Assertion `index`").to_json())
    sleeper = "[sys.executable, '-c', 'import time; time.sleep(120)']"
    holder = f"import subprocess, sys, time; subprocess.Popen({sleeper})"
    stuck = f"{holder}; print({crash!r}, flush=True); time.sleep(120)"
    seen: list[str] = []
    started = time.monotonic()
    child = minisgl_gpu.read_repeats([sys.executable, "-c", stuck], dict(os.environ), seen.append)
    assert time.monotonic() - started < 60
    assert child.lines == seen == [crash] and not child.silent


def test_a_process_that_says_nothing_stops_the_replay_unjudged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(minisgl_gpu, "_SILENCE", 0.5)
    started = time.monotonic()
    child = minisgl_gpu.read_repeats(
        [sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ), print
    )
    assert time.monotonic() - started < 60
    assert child.silent and child.lines == []
    monkeypatch.setattr(
        minisgl_gpu, "_child", lambda *args: minisgl_gpu.ChildRun([], None, "", silent=True)
    )
    out, unjudged = minisgl_gpu.gated_repeats(_Cex(), PLAN, 3)  # type: ignore[arg-type]
    assert out == [] and unjudged is not None and "said nothing" in unjudged
