"""A search resumed from its saved counterexample replays that failure first and shrinks on from
it: a shrink cut short (by the budget, Ctrl-C or a killed worker) is not lost work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.explore.database import DATABASE_KEY, FailureDatabase
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.named import NAMED

SPEC = SearchSpec(faults=frozenset(["copy-done-wrong-stream"]), budget=600, max_examples=400)


def test_a_resumed_search_fails_at_its_first_example_and_shrinks_no_bigger() -> None:
    first = search(SPEC)
    assert first.found is not None and first.found.choices
    resumed = search(replace(SPEC, resume=first.found.choices, seed=7))
    assert resumed.found is not None
    assert resumed.stats.examples_to_failure == 1  # the saved example, replayed
    assert len(resumed.found.result.scenario.requests) <= len(first.found.result.scenario.requests)
    assert (
        resumed.found.result.violations[0].invariant == first.found.result.violations[0].invariant
    )


def test_a_saved_failure_replays_first_from_the_database_and_from_resume(tmp_path: Path) -> None:
    late = SearchSpec(faults=frozenset(["stale-placeholder"]), budget=600, max_examples=300, seed=4)
    first = search(late)
    assert first.found is not None
    # From nothing saved, seed 11's first example does not fail: an example-1 failure below is
    # the saved one.
    assert search(replace(late, seed=11, max_examples=1)).found is None
    # Saved as a search saves it: under the search's own key (not a digest of its code, which
    # moved with every edit), in the spec's namespace. A later search with other seeds finds it.
    FailureDatabase(str(tmp_path), late.database_namespace()).save(
        DATABASE_KEY, first.found.choices
    )
    from_db = search(replace(late, database=str(tmp_path), seed=11))
    from_file = search(replace(late, resume=first.found.choices, seed=11))
    for again in (from_db, from_file):
        assert again.found is not None and again.stats.examples_to_failure == 1
        assert again.found.result.violations[0].invariant == "placeholder"


def test_explore_resume_takes_the_search_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    common = ["--budget", "600", "--max-examples", "400", "--workers", "1", "--no-timeline"]
    code = main(["explore", "--fault", "copy-done-wrong-stream", "--out", str(out), *common])
    assert code == 1
    (saved,) = out.glob("*.json")
    data = json.loads(saved.read_text())
    assert data["search"]["scenario"] == "all" and data["search"]["choices"]
    capsys.readouterr()
    again = tmp_path / "again"
    code = main(["explore", "--resume", str(saved), "--out", str(again), "--db", "none", *common])
    assert code == 1
    (resumed,) = again.glob("*.json")
    size = json.loads(resumed.read_text())["size"]
    assert size["requests"] <= data["size"]["requests"]


def test_resume_refuses_what_the_file_decides_and_a_file_without_a_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.json"
    path.write_text("{}")
    out = ["--out", str(tmp_path / "out")]
    assert main(["explore", "--resume", str(path), "--fault", "free-slot-early", *out]) == 2
    assert "drop --fault" in capsys.readouterr().err
    scenario = NAMED["single-slot"]().with_config(faults=frozenset(["copy-done-wrong-stream"]))
    run = run_scenario(scenario, SimBackend())
    saved = counterexample.save(run, Profile(), {}, tmp_path)  # as `replay` tools save one
    assert main(["explore", "--resume", str(saved), *out]) == 2
    assert "records no search to resume" in capsys.readouterr().err
