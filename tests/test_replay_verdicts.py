"""`replay` exit statuses: 1 reproduced, 0 the fix holds (and what changed), 4 a replay that
differs although nothing the file records changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.reference.faults import parse_faults
from overlapcheck.scenarios.named import named_scenario

BUGGY = """
from dataclasses import replace

from overlapcheck.reference.scheduler import Scheduler


def make(config, device, source, sink):
    return Scheduler(replace(config, faults=FAULTS), device, source, sink)


FAULTS = frozenset({"copy-done-wrong-stream"})
"""


def _saved_race(tmp_path: Path, spec: SchedulerSpec | None = None) -> Path:
    """A `no-race` counterexample of single-slot: the fault on, or a plugin that turns it on."""
    scenario = named_scenario("single-slot")
    if spec is None:
        scenario = scenario.with_config(faults=parse_faults(["copy-done-wrong-stream"]))
    factory = None if spec is None else spec.factory()
    result = run_scenario(scenario, SimBackend(), scheduler=factory)
    assert result.violations[0].invariant == "no-race"
    return counterexample.save(result, Profile(), {}, tmp_path, scheduler=spec)


def _replay(path: Path, *extra: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "overlapcheck", "replay", str(path), "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_an_exact_reproduction_is_1_and_records_the_reference_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _saved_race(tmp_path)
    assert json.loads(path.read_text())["scheduler"]["source_hash"] == SchedulerSpec().source_hash()
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("reproduced: [no-race]") and "(identical)" in out


def test_faults_off_the_fix_holds_and_it_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _saved_race(tmp_path)
    assert main(["replay", str(path), "--no-faults"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fixed: no-race no longer fires")
    assert "the faults are off (copy-done-wrong-stream)" in out


def test_a_fixed_scheduler_source_is_0_with_the_change_named(tmp_path: Path) -> None:
    plugin = tmp_path / "mine.py"
    plugin.write_text(BUGGY)
    path = _saved_race(tmp_path, SchedulerSpec(f"{plugin}:make"))
    plugin.write_text(BUGGY.replace('{"copy-done-wrong-stream"}', "()"))  # the fix
    code, report = _replay(path)
    assert (code, report["verdict"], report["reproduced"]) == (0, "fixed", False)
    assert "the scheduler's source changed" in str(report["changed"])


def test_a_replay_that_differs_with_nothing_changed_is_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _saved_race(tmp_path)
    data = json.loads(path.read_text())
    data["trace_hash"] = "0" * 16  # as if this run's trace were not the recorded one
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 4
    out = capsys.readouterr().out
    assert out.startswith("NOT REPRODUCED: the same violation, but trace")
    data["invariant"] = "oracle"  # a violation that this run does not have
    path.write_text(json.dumps(data))
    assert main(["replay", str(path), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "differs" and report["changed"] == []
