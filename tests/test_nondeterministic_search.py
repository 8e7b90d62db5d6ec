"""A scheduler whose runs are not the same twice (an order by object addresses, a clock, a global
random source) can make Hypothesis give up on an example it found failing, with one of its
`Flaky` errors. The search then reports the failure it found, says the scheduler is
nondeterministic, and never calls it a bug of overlapcheck's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.errors import FlakyStrategyDefinition

from overlapcheck.cli import main
from overlapcheck.explore import search as search_module
from overlapcheck.explore.search import CUT_NONDETERMINISTIC, Found, SearchSpec, search


@contextlib.contextmanager
def _hypothesis_calls_it_flaky() -> Iterator[None]:
    """What Hypothesis does when a failing example draws differently on its replay (a named
    scenario's failure is shrunk by Hypothesis, so it replays it)."""
    try:
        yield
    except Found as found:
        raise FlakyStrategyDefinition("inconsistent data generation") from found


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "_examples_from_the_seed_alone", _hypothesis_calls_it_flaky)


def test_a_round_hypothesis_gives_up_on_before_a_failure_is_not_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = []

    @contextlib.contextmanager
    def first_round_flaky() -> Iterator[None]:
        rounds.append(1)
        if len(rounds) == 1:
            raise FlakyStrategyDefinition("inconsistent data generation")
        yield

    monkeypatch.setattr(search_module, "_examples_from_the_seed_alone", first_round_flaky)
    spec = SearchSpec(faults=frozenset({"reply-after-finish"}), max_examples=200, budget=600)
    result = search(spec)
    assert len(rounds) >= 2 and result.found is not None


def test_the_failure_found_before_hypothesis_gave_up_is_the_result(flaky: None) -> None:
    spec = SearchSpec(
        scenario="early-eos",
        faults=frozenset({"reply-after-finish"}),
        max_examples=200,
        budget=600,
    )
    result = search(spec)
    assert result.found is not None, result.stats
    assert result.found.result.violations[0].invariant == "no-post-eos"
    assert result.cut == CUT_NONDETERMINISTIC


def test_explore_says_nondeterministic_saves_it_and_exits_1(
    flaky: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["explore", "--scenario", "early-eos", "--fault", "reply-after-finish", "--workers", "1"]
    status = main([*args, "--out", str(tmp_path), "--no-timeline", "--max-examples", "200"])
    out = capsys.readouterr()
    assert status == 1, out.err
    assert "nondeterministic" in out.out + out.err
    assert list(tmp_path.glob("no-post-eos-*.json"))


def test_a_user_scheduler_whose_replay_differs_is_a_finding_not_our_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    once = tmp_path / "once"
    once.write_text("1")  # the probe's build passes
    monkeypatch.setenv("OVERLAPCHECK_TEST_ONCE", str(once))
    flaky = f"{Path(__file__).parent / 'flaky_scheduler.py'}:make"
    args = ["explore", "--scheduler", flaky, "--max-examples", "100", "--workers", "1"]
    status = main([*args, "--out", str(tmp_path / "out"), "--no-timeline"])
    out = capsys.readouterr()
    assert status == 1, out.err
    assert "overlapcheck bug" not in out.err and "not the same twice" in out.err
    assert list((tmp_path / "out").glob("no-post-eos-*.json"))
