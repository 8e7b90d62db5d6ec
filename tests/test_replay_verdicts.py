"""`replay` exit statuses: 1 reproduced, 0 the fix holds (and what changed), 4 a replay that
differs although nothing the file records changed, or where only overlapcheck's own code changed
and nothing fires."""

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
from overlapcheck.harness.revision import checker_digest
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
    result = run_scenario(scenario, SimBackend(), scheduler=spec)
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
    roots = json.loads(path.read_text())["scheduler"]["code"]["roots"]
    # the reference is the code under test (other roots: what this test process imported)
    [root] = [r for r in roots if "reference/scheduler.py" in r["files"]]
    assert not any(name.startswith(("harness/", "invariants/")) for name in root["files"])
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
    assert report["changed"] == ["the scheduler's code changed: mine.py"]
    assert report["changed_files"] == ["mine.py"]


def test_a_scheduler_split_over_two_files_is_fixed_in_the_second(tmp_path: Path) -> None:
    """The fix is in a module the factory's file imports: the replay names that file and says
    fixed (exit 0), where it said NOT REPRODUCED (exit 4) when only the factory's file counted."""
    (tmp_path / "mine.py").write_text(
        "from dataclasses import replace\n\n"
        "from mine_faults import FAULTS\n"
        "from overlapcheck.reference.scheduler import Scheduler\n\n\n"
        "def make(config, device, source, sink):\n"
        "    return Scheduler(replace(config, faults=FAULTS), device, source, sink)\n"
    )
    faults = tmp_path / "mine_faults.py"
    faults.write_text('FAULTS = frozenset({"copy-done-wrong-stream"})\n')
    path = _saved_race(tmp_path, SchedulerSpec.load(f"{tmp_path / 'mine.py'}:make"))
    faults.write_text("FAULTS = frozenset()  # the fix\n")
    code, report = _replay(path)
    assert (code, report["verdict"]) == (0, "fixed"), report
    assert report["changed_files"] == ["mine_faults.py"]


def test_a_file_that_recorded_one_hash_of_the_source_still_loads_and_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = tmp_path / "mine.py"
    plugin.write_text(BUGGY)
    spec = SchedulerSpec(f"{plugin}:make")
    path = _saved_race(tmp_path, spec)
    data = json.loads(path.read_text())
    data["scheduler"] = {"spec": spec.text, "source_hash": spec.source_hash()}  # as files were
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 1
    assert capsys.readouterr().out.startswith("reproduced: [no-race]")
    plugin.write_text(BUGGY.replace('{"copy-done-wrong-stream"}', "()"))
    code, report = _replay(path)  # (a new process: this one keeps the module it imported)
    assert (code, report["changed_files"]) == (0, ["mine.py"])


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


def test_a_file_written_by_another_overlapcheck_is_never_blamed_nor_called_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only overlapcheck's own code changed since the file was written (its digest differs):
    a different trace is explained by that, not called a bug of either side; and where nothing
    fires any more it is not a fix (the scheduler did not change)."""
    path = _saved_race(tmp_path)
    data = json.loads(path.read_text())
    assert data["checker"] == checker_digest()
    data["checker"] = "0" * 16  # written by another overlapcheck
    data["trace_hash"] = "0" * 16  # whose trace differed
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("reproduced: [no-race]")
    assert "overlapcheck's own code changed since the file was written" in out
    data["invariants"] = ["oracle"]  # a check under which nothing fires in this run
    path.write_text(json.dumps(data))
    assert main(["replay", str(path), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "differs"
    assert report["changed"] == ["overlapcheck's own code changed since the file was written"]
    assert main(["replay", str(path)]) == 4
    assert "search again" in capsys.readouterr().out
    data["invariants"] = ["oracle", "no-race"]  # another invariant than the recorded one fires
    data["invariant"] = "oracle"
    path.write_text(json.dumps(data))
    assert main(["replay", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "other"


def test_a_fix_in_a_patched_copy_of_the_tree_is_a_changed_file(tmp_path: Path) -> None:
    """The engine's variable names another folder (a patched copy) while the recorded one still
    holds the old code: the file that differs is named, not 'nothing changed'."""
    from overlapcheck.harness.fingerprint import CodeFingerprint, CodeRoot, file_hash

    for folder, body in (("orig", "x = 1\n"), ("patched", "x = 2\n")):
        (tmp_path / folder / "engine").mkdir(parents=True)
        (tmp_path / folder / "engine" / "sched.py").write_text(body)
        (tmp_path / folder / "engine" / "util.py").write_text("y = 0\n")

    def root(folder: str) -> CodeRoot:
        base = tmp_path / folder
        names = ("engine/sched.py", "engine/util.py")
        return CodeRoot(str(base), {n: file_hash(base / n) for n in names})

    recorded = CodeFingerprint((root("orig"),))
    assert recorded.changed_files(CodeFingerprint((root("patched"),))) == ["engine/sched.py"]
    assert recorded.changed_files(CodeFingerprint((root("orig"),))) == []


def test_a_file_recorded_on_another_machine_names_no_change_before_the_run(tmp_path: Path) -> None:
    """The recorded folder does not exist here and nothing was imported yet (the note before a
    run): the files cannot be compared, so none is called changed; once the replay imported the
    code from its folder here, a file that differs is named."""
    from overlapcheck.harness.fingerprint import CodeFingerprint, CodeRoot, file_hash

    here = tmp_path / "here"
    (here / "engine").mkdir(parents=True)
    (here / "engine" / "sched.py").write_text("x = 2\n")
    recorded = CodeFingerprint(
        (CodeRoot(str(tmp_path / "elsewhere"), {"engine/sched.py": "0" * 16}),)
    )
    assert recorded.changed_files() == []
    now = CodeFingerprint(
        (CodeRoot(str(here), {"engine/sched.py": file_hash(here / "engine/sched.py")}),)
    )
    assert recorded.changed_files(now) == ["engine/sched.py"]
