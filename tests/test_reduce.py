"""The workload passes that finish a generated failure's shrink (`explore/reduce.py`): they keep
the broken invariant, end within their run bound, and cut what the failure does not need."""

from __future__ import annotations

from dataclasses import replace

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import Anchor, RequestSpec, Scenario
from overlapcheck.explore.reduce import Run, reduce_failure, replay_runner, size
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.harness.runner import RunResult, run_scenario

FAULT = "finish-by-can-decode"  # any request of two tokens or more, under overlap


def _runner(seen: list[RunResult]) -> Run:
    def run_example(scenario: Scenario, backend: SimBackend) -> RunResult:
        result = run_scenario(scenario, backend)
        seen.append(result)
        return result

    return replay_runner(Profile(), run_example)


def _failing() -> tuple[RunResult, dict[int, float]]:
    config = SchedulerConfig(
        num_slots=4, num_pages=64, cache="radix", loop="overlap", faults=frozenset([FAULT])
    )
    reqs = (
        RequestSpec(0, (500, 501, 502, 503), max_tokens=6, continuation=(700, 701, 2)),
        RequestSpec(7, (500, 501, 900), max_tokens=3, arrival=30e-6, abort_iteration=9),
        RequestSpec(9, (42,), max_tokens=4, arrival_after=Anchor(0, "finished")),
    )
    delays = {3: 20e-6, 5: 40e-6}
    result, drawn = _runner([])(Scenario("generated", config, reqs), delays)
    assert result.violations
    return result, drawn


def test_the_passes_keep_the_invariant_and_cut_what_the_failure_does_not_need() -> None:
    result, draws = _failing()
    invariant = result.violations[0].invariant
    seen: list[RunResult] = []
    smaller: list[RunResult] = []
    reduced = reduce_failure(result, draws, _runner(seen), 200, lambda r, d: smaller.append(r))
    assert 0 < reduced.runs == len(seen) <= 200 and not reduced.stopped
    assert smaller and smaller[-1] is reduced.result
    for r in smaller:  # each one kept breaks the same invariant, and each is smaller
        assert r.violations[0].invariant == invariant
    out = reduced.result.scenario
    assert len(out.requests) == 1 and out.config.num_slots == 1 and out.config.cache == "naive"
    (req,) = out.requests
    assert req.uid == 0 and req.prompt == (3,) and not req.continuation and req.max_tokens == 2
    assert reduced.draws == {}
    assert size(out, reduced.draws) < size(result.scenario, draws)


def test_the_passes_end_at_their_run_bound_or_when_told() -> None:
    result, draws = _failing()
    seen: list[RunResult] = []
    assert reduce_failure(result, draws, _runner(seen), 3).runs == len(seen) == 3
    stopped = reduce_failure(result, draws, _runner([]), 200, stop=lambda: True)
    assert stopped.stopped and stopped.runs == 0 and stopped.result is result


def test_a_generated_failure_goes_to_the_passes_after_the_examples_hypothesis_may_shrink() -> None:
    spec = SearchSpec(faults=frozenset(["free-slot-early"]), budget=3600, seed=0)
    # Seed 0's first failure has 4 requests: the passes alone take it to 3, after 8 examples
    # Hypothesis may shrink to 2 (the generator's stream decides which example that is).
    for examples, most in ((0, 3), (8, 2)):
        result = search(replace(spec, shrink_examples=examples))
        stats = result.stats
        assert result.found is not None and result.cut is None
        assert stats.examples_to_failure is not None
        # One example at least after the failure: Hypothesis records it only once it raised.
        assert stats.examples - stats.examples_to_failure == max(1, examples)
        assert 0 < stats.reduce_runs <= spec.reduce_runs
        assert result.found.result.violations[0].invariant == "slot-not-in-flight"
        assert len(result.found.result.scenario.requests) <= most
