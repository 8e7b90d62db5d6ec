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
