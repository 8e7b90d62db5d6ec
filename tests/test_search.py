"""The search finds every named fault from an empty example database, shrinks it, and the saved
counterexample replays with the same trace hash; the fixed scheduler survives generated examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.formats import counterexample
from overlapcheck.reference.faults import FAULTS
from overlapcheck.scenarios.named import NAMED


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_search_finds_shrinks_and_replays_each_fault(fault: str, tmp_path: Path) -> None:
    result = search(SearchSpec(faults=frozenset([fault]), budget=120, max_examples=5000, seed=1))
    assert result.found is not None, f"{fault} not found in {result.stats.examples} examples"
    run = result.found.result
    violation = run.violations[0]
    assert violation.invariant in FAULTS[fault].breaks, violation.line()
    assert len(run.scenario.requests) <= 3  # shrunk: every fault needs at most 2 requests
    path = counterexample.save(run, Profile(), result.found.draws, tmp_path)
    cex = counterexample.load(path)
    replayed = cex.replay()
    assert cex.reproduced(replayed) is not None
    assert replayed.trace_hash == run.trace_hash


def test_the_fault_is_what_breaks_it(tmp_path: Path) -> None:
    """The same counterexample with the fault switched off is clean."""
    result = search(
        SearchSpec(faults=frozenset(["staging-buffer-reuse"]), budget=60, max_examples=2000, seed=2)
    )
    assert result.found is not None
    path = counterexample.save(result.found.result, Profile(), result.found.draws, tmp_path)
    cex = counterexample.load(path)
    fixed = cex.without_faults()
    assert fixed.replay().ok


@pytest.mark.parametrize("scenario", ["all", *NAMED])
def test_the_default_scheduler_survives_generated_examples(scenario: str) -> None:
    n = 200 if scenario == "all" else 60
    result = search(SearchSpec(scenario, budget=120, max_examples=n, seed=3))
    assert result.found is None, result.found and result.found.result.violations[0].line()
    assert result.stats.examples >= n


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_long_search_of_the_default_scheduler(seed: int) -> None:
    result = search(SearchSpec("all", budget=600, max_examples=5000, seed=100 + seed))
    assert result.found is None, result.found and result.found.result.violations[0].line()
