"""The command line: exit codes, JSON fields, and one clear line for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlapcheck.cli import main
from overlapcheck.reference.faults import FAULTS


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def one_error_line(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_json_has_the_contract_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scenario", "early-eos", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {
        "backend",
        "scenario",
        "loop",
        "requests",
        "violations",
        "trace_hash",
        "stats",
    } <= data.keys()
    assert {"iterations", "simulated_seconds", "wall_seconds"} <= data["stats"].keys()
    assert [r["finish_reason"] for r in data["requests"]] == ["eos"] * 4
    assert data["violations"] == [] and data["backend"] == "sim"


def test_run_exits_1_on_a_violation_and_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scenario", "single-slot", "--fault", "copy-done-wrong-stream"]) == 1
    assert "VIOLATION [no-race]" in capsys.readouterr().out


def test_run_human_output_has_a_line_per_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "run",
                "--scenario",
                "abort",
                "--loop",
                "normal",
                "--cache",
                "naive",
                "--page-size",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("uid ") == 6 and "ok:" in out and "loop=normal cache=naive page_size=2" in out


def test_faults_lists_every_fault_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults", "--json"]) == 0
    names = {f["name"] for f in json.loads(capsys.readouterr().out)}
    assert "free-slot-early" in names and names == set(FAULTS)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--scenario", "nope"], "unknown scenario 'nope'"),
        (["run", "--fault", "bogus"], "unknown fault bogus"),
        (["run", "--page-size", "0"], "expected a positive integer"),
        (["run", "--loop", "sideways"], "invalid choice"),
        (["run", "--scenario", "missing.json"], "no such scenario file"),
        (["explore", "--fault", "bogus", "--budget", "1"], "unknown fault bogus"),
        (["explore", "--scenario", "nope"], "unknown scenario"),
        (["explore", "--budget", "0"], "--budget"),  # one line naming the option
        (["explore", "--out", "/proc/no-such-dir"], "cannot create the folder"),
        (["explore", "--skip", "nope"], "unknown invariant nope"),
        (["run", "--timing", "missing.json"], "no such timing profile"),
        (["replay", "missing.json"], "no such counterexample file"),
        (["calibrate", "--backend", "cpu", "--traces", "out"], "--traces goes with --check"),
        (["calibrate", "--check", "missing.json"], "no such timing profile"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args: list[str], needle: str) -> None:
    one_error_line(cli(*args), needle)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "something-else"}', "not an overlapcheck counterexample"),
        ('{"format": "overlapcheck-counterexample", "version": 99}', "format version 99"),
        ('{"format": "overlapcheck-counterexample", "version": 1}', "lacks scenario"),
        (
            '{"format": "overlapcheck-counterexample", "version": 1, "invariant": "oracle",'
            ' "trace_hash": "x",'
            ' "faults": ["bogus"], "scenario": {"requests": [{"uid": 0, "prompt": [5]}]}}',
            "unknown fault bogus",
        ),
    ],
)
def test_bad_counterexample_files(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "cex.json"
    path.write_text(content)
    one_error_line(cli("replay", str(path)), needle)


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        ("{", ".json", "not valid JSON"),
        ("requests = 1", ".toml", "'requests' must be a non-empty list"),
        ('{"requests": [{"uid": 0}]}', ".json", "needs 'uid' and 'prompt'"),
        ('{"requests": [{"uid": 0, "prompt": ["a"]}]}', ".json", "expected an integer"),
        (
            '{"config": {"num_slots": 0}, "requests": [{"uid": 0, "prompt": [5]}]}',
            ".json",
            "num_slots must be >= 1",
        ),
        (
            '{"config": {"colour": 1}, "requests": [{"uid": 0, "prompt": [5]}]}',
            ".json",
            "unknown config field colour",
        ),
    ],
)
def test_bad_scenario_files(tmp_path: Path, content: str, suffix: str, needle: str) -> None:
    path = tmp_path / f"s{suffix}"
    path.write_text(content)
    one_error_line(cli("run", "--scenario", str(path)), needle)


def test_a_toml_scenario_file_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\n[config]\nnum_slots = 1\npage_size = 2\n'
        "[[requests]]\nuid = 7\nprompt = [5, 6, 7]\nmax_tokens = 3\n"
        "[[requests]]\nuid = 8\nprompt = [5, 6, 9]\nmax_tokens = 2\ncontinuation = [2]\n"
    )
    assert main(["run", "--scenario", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["uid"], r["finish_reason"]) for r in data["requests"]] == [(7, "length"), (8, "eos")]


def test_explore_and_replay_round_trip(tmp_path: Path) -> None:
    found = cli(
        "explore",
        "--fault",
        "reply-after-finish",
        "--budget",
        "60",
        "--out",
        str(tmp_path),
        "--no-timeline",
    )
    assert found.returncode == 1, found.stdout + found.stderr
    # The fault shows as `no-post-eos` or `exact-length` (a reply to a uid still live), whichever
    # example the generator's stream reaches first.
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 1 and f"overlapcheck replay {files[0]}" in found.stdout
    assert files[0].name.startswith(("no-post-eos-", "exact-length-")), files[0].name
    replay = cli("replay", str(files[0]), "--json")
    assert replay.returncode == 1
    data = json.loads(replay.stdout)
    assert data["reproduced"] and data["same_trace_hash"]


def test_explore_without_faults_finds_nothing(tmp_path: Path) -> None:
    out = ("--out", str(tmp_path))
    proc = cli("explore", "--max-examples", "12", "--budget", "3600", "--seed", "5", *out)
    assert proc.returncode == 0 and "no violation found: 12 examples" in proc.stdout


def test_explore_writes_timelines_beside_the_counterexample_without_clobbering_it(
    tmp_path: Path,
) -> None:
    proc = cli(
        "explore",
        "--fault",
        "copy-done-wrong-stream",
        "--max-examples",
        "500",
        "--budget",
        "3600",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 1, proc.stderr
    (cex,) = tmp_path.glob("no-race-*.json")  # the counterexample alone: its glob is one file
    data = json.loads(cex.read_text())
    assert data["format"] == "overlapcheck-counterexample" and data["trace"]["ops"]
    perfetto = json.loads(cex.with_suffix(".perfetto").read_text())
    assert perfetto["traceEvents"]
    assert cex.with_suffix(".png").stat().st_size > 1000
