"""`overlapcheck report`: a Markdown bug report from a counterexample, with the lines, the
workload, the interleaving, the replay command and a fix to try derived from the finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.core.sites import Location
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import run_scenario
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.fixes import fix_to_try
from overlapcheck.scenarios.loader import scenario_from_dict
from tests.test_locations import EARLY_FREE


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    return counterexample.save(result, Profile(), {}, tmp_path_factory.mktemp("cex"))


def test_a_report_names_the_lines_the_workload_the_replay_and_a_fix(
    found: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bug.md"
    assert main(["report", str(found), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# `slot-not-in-flight`: a slot reused while a launched batch")
    for heading in ("What goes wrong", "Where", "Minimal workload", "The interleaving"):
        assert f"## {heading}" in text
    assert "| freed | `reference/scheduler.py:" in text  # the line that freed it, first
    assert "| in flight |" in text and "| reused |" in text
    assert '{"uid": 1, "prompt": [3], "max_tokens": 2, "continuation": [2]}' in text
    assert f"overlapcheck replay {found}" in text
    assert "Defer the free (`reference/scheduler.py:" in text
    assert "Timeline: `" in text and Path(text.split("Timeline: `")[1].split("`")[0]).is_file()


def test_a_fix_to_try_follows_the_finding_kind_and_its_words() -> None:
    def loc(role: str, agent: str) -> Location:
        return Location(role, "engine/run.py", 7, "step", "/src", agent, 1, "op")

    reuse = Violation(
        "no-race",
        2,
        0.0,
        (),
        "WAR",
        {"first": {"agent": "engine"}, "second": {"agent": "scheduler"}},
        (loc("read", "engine"), loc("reused", "scheduler"), loc("write", "scheduler")),
    )
    assert "`record_stream` with engine's stream" in fix_to_try(reuse)
    plain = Violation(
        "no-race",
        2,
        0.0,
        (),
        "RAW",
        {"first": {"agent": "scheduler"}, "second": {"agent": "engine"}},
    )
    assert "make engine wait for scheduler (`wait_stream`" in fix_to_try(plain)
    slot = Violation("slot-not-in-flight", 2, 0.0, (), "", {}, (loc("freed", "host"),))
    assert fix_to_try(slot, {"slot": "table_idx"}).startswith("The table_idx goes back")


def test_bad_input_is_one_line_and_exit_2(
    found: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert main(["report", str(found), "-o", str(tmp_path / "bug.txt")]) == 2
    not_one = tmp_path / "trace.json"
    not_one.write_text('{"format": "overlapcheck-trace", "version": 1}')
    assert main(["report", str(not_one)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("overlapcheck: error:") for line in lines)
