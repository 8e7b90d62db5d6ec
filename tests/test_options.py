"""Options a first-time user reaches for: faults in a scenario file, `run --skip`, `explore --loop`,
and a found bug whose file cannot be written still exiting 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapcheck.cli import main
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.search import SearchSpec
from overlapcheck.scenarios.loader import load_scenario_file

FAULTY_TOML = """name = "faulty"
[config]
faults = ["finish-by-can-decode"]
[[requests]]
uid = 0
prompt = [5, 6, 7]
max_tokens = 4
ignore_eos = true
"""


NORMAL_ONLY = """
from dataclasses import replace

from overlapcheck.examples.minimal_scheduler import MinimalScheduler


def make(config, device, source, sink):  # has only a normal loop, whatever the run asks for
    return MinimalScheduler(replace(config, loop="normal"), device, source, sink)
"""


def test_a_scenario_file_switches_faults_on(tmp_path: Path) -> None:
    path = tmp_path / "faulty.toml"
    path.write_text(FAULTY_TOML)
    assert load_scenario_file(path).config.faults == {"finish-by-can-decode"}
    assert main(["run", "--scenario", str(path)]) == 1
    # --fault adds to the file's faults rather than replacing them
    assert main(["run", "--scenario", str(path), "--fault", "free-slot-early"]) == 1


# Two bugs, two findings: a length-limited request finished one token early (exact-length), and
# one stopped at EOS whose launched round's token is still sent (no-post-eos).
TWO_BUGS_TOML = """name = "two-bugs"
[config]
faults = ["finish-by-can-decode", "reply-after-finish"]
[[requests]]
uid = 0
prompt = [5, 6, 7]
max_tokens = 4
ignore_eos = true
[[requests]]
uid = 1
prompt = [8, 9]
max_tokens = 4
continuation = [41, 2, 43]
"""


def test_run_skip_looks_past_a_known_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "faulty.toml"
    path.write_text(TWO_BUGS_TOML)
    assert main(["run", "--scenario", str(path), "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["violations"][0]["invariant"]
    assert first == "exact-length"
    assert main(["run", "--scenario", str(path), "--json", "--skip", first]) == 1
    violations = json.loads(capsys.readouterr().out)["violations"]
    assert violations and all(v["invariant"] != first for v in violations)
    assert main(["run", "--scenario", str(path), "--skip", first, "--skip", "no-post-eos"]) == 0


@settings(max_examples=30, deadline=None, database=None)
@given(st.data())
def test_explore_loop_pins_the_loop_of_every_example(data: st.DataObject) -> None:
    for scenario in ("all", "basic"):
        drawn = data.draw(SearchSpec(scenario=scenario, loop="normal").strategy())
        assert isinstance(drawn, Scenario) and drawn.config.loop == "normal"


def test_explore_loop_normal_searches_a_normal_loop_only_scheduler_clean(tmp_path: Path) -> None:
    """Drawn, the loop is overlap in about half the examples, where a scheduler with only a
    normal loop fails no-hidden-sync at once (test below); pinned to normal, 25 find nothing."""
    path = tmp_path / "normal_only.py"
    path.write_text(NORMAL_ONLY)
    argv = ["explore", "--scheduler", f"{path}:make", "--workers", "1", "--db", "none"]
    argv += ["--max-examples", "25", "--no-timeline", "--out", str(tmp_path), "--loop", "normal"]
    assert main(argv) == 0


def test_a_found_bug_whose_file_cannot_be_written_still_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from overlapcheck.explore import keeper

    def disk_full(self: Any, data: Any) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keeper.FailureKeeper, "finish", disk_full)
    argv = ["explore", "--fault", "copy-done-wrong-stream", "--workers", "1", "--db", "none"]
    code = main([*argv, "--max-examples", "50", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "cannot save the counterexample (No space left on device)" in err
    report = json.loads(out)  # the one JSON document; the printed counterexample went to stderr
    assert report["exit"] == 1 and report["violation"]["invariant"] == "no-race"
    assert '"format": "overlapcheck-counterexample"' in err


def test_workers_beyond_the_cores_are_capped_with_one_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from overlapcheck.commands import explore

    monkeypatch.setattr(explore, "available_cores", lambda: 1)
    argv = ["explore", "--workers", "1000", "--max-examples", "5", "--db", "none"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    notices = [line for line in err.splitlines() if "--workers" in line]
    assert notices == ["notice: --workers 1000 is more than the 1 available core(s); using 1"]
    assert "no violation found: 5 examples" in out


def test_scheduler_module_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--scheduler mysched:make` from the folder holding mysched.py, as `mysched.py:make` does;
    the console script, unlike `python -m`, does not put the folder on the path."""
    import sys

    name = "sched_in_the_current_folder"
    (tmp_path / f"{name}.py").write_text(
        "from overlapcheck.examples.minimal_scheduler import make_scheduler as make\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["run", "--scenario", "basic", "--scheduler", f"{name}:make"]) == 0
    assert "ok:" in capsys.readouterr().out
    assert main(["run", "--scheduler", "no_such_module_here:make"]) == 2


def test_a_normal_loop_only_scheduler_gets_a_hint_and_runs_clean_with_loop_normal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "normal_only.py"
    path.write_text(NORMAL_ONLY)
    argv = ["run", "--scenario", "basic", "--scheduler", f"{path}:make"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "VIOLATION [no-hidden-sync]" in out
    assert "hint: no-hidden-sync is checked because the run asks for the overlap loop" in err
    assert main([*argv, "--loop", "normal"]) == 0
    assert "hint:" not in capsys.readouterr().err


def test_explore_names_the_skip_that_moves_on_and_it_finds_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's chain: explore a scheduler with several bugs, then skip what it found. The
    README once named the invariant to skip (`exact-length`) where the search may find another
    first, and then the next search found the same again: the line to skip comes from the run."""
    upstream = "overlapcheck.examples.upstream_overlap:make_scheduler"
    search = ["explore", "--scheduler", upstream, "--workers", "1", "--max-examples", "300"]
    search += ["--budget", "3600", "--no-timeline", "--db", "none"]
    assert main([*search, "--out", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out
    [hint] = [line for line in out.splitlines() if line.startswith("next: add --skip ")]
    first = hint.split()[3]
    assert f"VIOLATION [{first}]" in out
    assert main([*search, "--out", str(tmp_path / "b"), "--skip", first]) == 1
    second = capsys.readouterr().out
    assert f"VIOLATION [{first}]" not in second and "VIOLATION [" in second
