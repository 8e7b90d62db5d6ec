"""`timeline --compare-backends`: a real device's timeline above the simulator's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from overlapcheck.cli import main


def test_compare_backends_on_the_cpu_draws_both_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "both.png"
    assert (
        main(
            [
                "timeline",
                "--compare-backends",
                "--backend",
                "cpu",
                "--scenario",
                "single-slot",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("single-slot, overlap loop (cpu)") and "(sim)" in lines[1]
    assert out.stat().st_size > 10_000


def test_compare_backends_needs_a_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", "--compare-backends", "--backend", "cpu", "-o", "x.png"]) == 2
    assert "give --scenario NAME" in capsys.readouterr().err


def test_the_simulator_side_runs_the_work_the_device_did(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Arrivals are times; without the device's message iterations, a later request joins the
    simulator's run at another iteration and the two timelines are not the same schedule."""
    from overlapcheck.harness.runner import RunResult
    from overlapcheck.timeline import compare

    drawn: list[RunResult] = []

    def keep(real: RunResult, sim: RunResult, *args: object) -> compare.Rendered:
        drawn.extend((real, sim))
        return compare.Rendered(tmp_path / "x.png", ())

    monkeypatch.setattr(compare, "render_backends", keep)
    args = ["timeline", "--compare-backends", "--backend", "cpu", "--scenario", "basic"]
    assert main([*args, "-o", str(tmp_path / "x.png")]) == 0
    real, sim = drawn
    assert real.deliveries and sim.deliveries == real.deliveries
    assert sim.iterations == real.iterations
    assert [len(o.tokens) for o in sim.outcomes] == [len(o.tokens) for o in real.outcomes]
