"""How a GPU replay of a mini-sglang counterexample judges its repeats (`replay/minisgl_gpu.py`),
with the GPU runs stood in for: a device error is the race manifested and the repeats after it
run in fresh processes; a fix is told apart from a race that reached no output; a plan that does
not line up runs nothing and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from overlapcheck.adapters.minisgl.cuda import CudaGate, Point
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


def test_a_device_error_is_the_race_and_the_rest_run_in_fresh_processes(
    stand_ins: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def in_process(cex: Any, plan: Plan, i: int) -> Repeat:
        stand_ins.append(("here", i))
        return Repeat(i, [], [], [], crash="AcceleratorError: CUDA error: device-side assert")

    def fresh(cex: Any, plan: Plan, i: int) -> Repeat:
        stand_ins.append(("fresh", i))
        return Repeat(i, [0], ["forced (1.0 ms)"], [OPENED])

    monkeypatch.setattr(minisgl_gpu, "one_repeat", in_process)
    monkeypatch.setattr(minisgl_gpu, "_in_fresh_process", fresh)
    repeats, misfit = minisgl_gpu.replay(_Cex(), PLAN, 3, NAMES)  # type: ignore[arg-type]
    assert misfit is None
    assert stand_ins == [("here", 0), ("fresh", 1), ("fresh", 2)]
    assert all(r.manifested for r in repeats)
    assert "the GPU run failed: AcceleratorError" in repeats[0].line()


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
