"""A found bug is never lost: it is on disk from the moment it is found, each smaller failure found
while shrinking replaces it, and Ctrl-C or the budget during shrinking leave the smallest so far as
a counterexample that replays (exit 1). The example database defaults to a folder beside the
counterexamples, so a rerun starts from what the last run found."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from overlapcheck.cli import main
from overlapcheck.explore.keeper import FailureKeeper
from overlapcheck.explore.parallel import Listener, Outcome, search_streams
from overlapcheck.explore.search import CUT_BUDGET, Found, SearchSpec, search
from overlapcheck.formats import counterexample
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.replay.sim import replay_on_sim

FAULT = "free-slot-early"


def explore(out: Path, *extra: str) -> list[str]:
    return [
        "explore",
        "--fault",
        FAULT,
        "--out",
        str(out),
        "--no-timeline",
        "--budget",
        "60",
        "--json",
        *extra,
    ]


def interrupt_once_saved(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Ctrl-C right after the first failure is saved: the search is then shrinking it."""
    saved: list[Path] = []
    first = FailureKeeper.first

    def first_then_ctrl_c(self: FailureKeeper, found: Counterexample) -> None:
        first(self, found)
        assert self.path is not None and self.path.exists()
        saved.append(self.path)
        raise KeyboardInterrupt

    monkeypatch.setattr(FailureKeeper, "first", first_then_ctrl_c)
    return saved


def assert_replays(path: Path, invariant: str) -> None:
    cex = counterexample.load(path)
    run = replay_on_sim(cex)
    assert run.trace_hash == cex.trace_hash
    assert cex.reproduced(run) is not None and cex.invariant == invariant


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_while_shrinking_keeps_the_failure_and_exits_1(
    workers: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    saved = interrupt_once_saved(monkeypatch)
    rc = main(explore(tmp_path, "--workers", workers))
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    report = json.loads(captured.out)  # stdout is exactly one JSON document
    assert report["found"] and report["interrupted"] and report["shrink"] == "interrupted"
    assert "shrinking interrupted" in captured.err
    assert "saved before shrinking" in captured.err
    path = Path(report["counterexample"])
    assert path.exists() and not path.name.startswith(counterexample.UNSHRUNK)
    assert len(saved) == 1 and not saved[0].exists()  # the unshrunk file became the counterexample
    assert f"removed {saved[0]}, saved before shrinking: {path} replaces it" in captured.err
    assert report["violation"]["invariant"] == report["unshrunk"]["invariant"]
    assert_replays(path, report["violation"]["invariant"])


def test_ctrl_c_before_anything_is_found_exits_130_with_the_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from overlapcheck.explore import search as search_module

    calls: list[int] = []
    completed: list[int] = []  # Hypothesis may stop a run that overran its choices: not an example
    run_example = search_module.run_example

    def ctrl_c_on_the_tenth(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        result = run_example(*args)
        completed.append(1)
        return result

    monkeypatch.setattr(search_module, "run_example", ctrl_c_on_the_tenth)
    rc = main(["explore", "--out", str(tmp_path), "--workers", "1", "--json"])
    captured = capsys.readouterr()
    assert rc == 130
    done = len(completed)
    assert 0 < done <= 9
    assert f"interrupted; nothing found in {done} examples" in captured.err
    report = json.loads(captured.out)
    assert report["interrupted"] and not report["found"] and report["stats"]["examples"] == done


def search_keeping(out: Path, seed: int) -> tuple[FailureKeeper, list[Counterexample], Outcome]:
    """A search whose failure a keeper holds in `out`; returns each replacement as written."""
    keeper = FailureKeeper(out, lambda line: None)
    replaced: list[Counterexample] = []

    def smaller(found: Counterexample) -> None:
        keeper.smaller(found)
        assert keeper.path is not None
        assert json.loads(keeper.path.read_text())["trace_hash"] == found.trace_hash
        replaced.append(found)

    spec = SearchSpec(faults=frozenset([FAULT]), budget=3600, seed=seed)
    outcome = search_streams(spec, 1, Listener(unshrunk=keeper.first, smaller=smaller))
    assert outcome.found is not None and outcome.cut is None
    return keeper, replaced, outcome


def test_each_smaller_failure_replaces_the_saved_file(tmp_path: Path) -> None:
    # A first failure can already be minimal in Hypothesis's order (a named scenario's variation
    # with every other choice at its simplest): then there is nothing to replace, and the next
    # seed is tried.
    for seed in range(6):
        out = tmp_path / str(seed)
        keeper, replaced, outcome = search_keeping(out, seed)
        if replaced:
            break
    assert outcome.found is not None
    assert len(replaced) == keeper.replaced == outcome.stats.smaller > 0
    assert keeper.path is not None
    on_disk = json.loads(keeper.path.read_text())
    # The file ends holding the last (smallest) one, which is what shrinking settled on.
    assert on_disk["trace_hash"] == replaced[-1].trace_hash == outcome.found.trace_hash
    first = outcome.unshrunk
    assert first is not None
    assert outcome.found.requests <= first.requests
    assert not list(out.glob(".*.tmp"))  # every replacement was renamed into place
    path = keeper.finish(outcome.found)
    assert not keeper.kept
    assert_replays(path, outcome.found.invariant)


class _Clock:
    """`time` as the search reads it, with a jump the test controls: the budget runs out at
    the moment the test says, however fast or loaded the machine is."""

    def __init__(self) -> None:
        self.jump = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.jump

    def monotonic(self) -> float:
        return time.monotonic() + self.jump


def test_the_budget_running_out_while_shrinking_keeps_the_smallest_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from overlapcheck.explore import search as search_module

    clock = _Clock()
    monkeypatch.setattr(search_module, "time", clock)
    spec = SearchSpec(faults=frozenset([FAULT]), budget=3600, max_examples=2000, seed=0)

    def slow_save(found: Found) -> bool:
        clock.jump = spec.budget  # the budget is spent by the time shrinking would start
        return True

    result = search(spec, on_failure=slow_save)
    assert result.cut == CUT_BUDGET and result.found is not None
    assert result.found.result.violations


def test_a_rerun_resumes_from_the_default_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(explore(tmp_path, "--workers", "1")) == 1
    first = json.loads(capsys.readouterr().out)
    assert (tmp_path / ".examples-db").is_dir()
    assert main(explore(tmp_path, "--workers", "1")) == 1
    second = json.loads(capsys.readouterr().out)
    assert second["stats"]["examples_to_failure"] == 1 < first["stats"]["examples_to_failure"]
    assert second["violation"]["invariant"] == first["violation"]["invariant"]


def test_another_fault_set_neither_replays_nor_deletes_saved_failures(tmp_path: Path) -> None:
    db = tmp_path / "db"

    def saved() -> set[Path]:
        return {p.relative_to(db) for p in db.rglob("*") if p.is_file()}

    one = SearchSpec(faults=frozenset([FAULT]), budget=3600, seed=0, database=str(db))
    assert search(one).found is not None
    before = saved()
    # The shipped scheduler over the same database: the fault's failures do not replay here
    # (unkeyed, they did, passed, and Hypothesis deleted them)...
    clean = search(SearchSpec(budget=3600, max_examples=30, seed=0, database=str(db)))
    assert clean.found is None
    assert before <= saved()
    # ...and they are there for the fault's own rerun.
    again = search(one)
    assert again.found is not None and again.stats.examples_to_failure == 1


def saved_counterexample(folder: Path) -> Path:
    # Any counterexample will do: this fault is found and shrunk in a few examples.
    spec = SearchSpec(faults=frozenset(["copy-done-wrong-stream"]), budget=3600, seed=0)
    outcome = search_streams(spec, 1)
    assert outcome.found is not None
    return outcome.found.save(folder)


def test_the_reliability_bench_reports_no_violation_and_identical_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved_counterexample(tmp_path)
    argv = ["bench", "--reliability", "--examples", "20", "--replays", "4", "--workers", "2"]
    rc = main(
        [*argv, "--counterexamples", str(tmp_path), "--out", str(tmp_path / "found"), "--json"]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads(captured.out)["reliability"]
    assert report["examples"] == 20 and report["violations"] == 0
    assert report["replays"] == report["identical"] == 4 and report["ok"]
    assert "4 identical" in captured.err  # the table went to stderr


def test_the_reliability_bench_reports_a_tampered_counterexample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = saved_counterexample(tmp_path)
    data = json.loads(path.read_text())
    data["trace_hash"] = "0" * len(data["trace_hash"])
    path.write_text(json.dumps(data))
    argv = ["bench", "--reliability", "--examples", "4", "--replays", "2", "--workers", "2"]
    rc = main([*argv, "--counterexamples", str(tmp_path), "--out", str(tmp_path / "found")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "0 identical" in out and "2 differ" in out and "reliability: FAILED" in out
    assert f"(recorded {data['trace_hash']})" in out
