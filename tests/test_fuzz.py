"""The search as a plain Hypothesis test: the default scheduler holds every invariant on generated
workloads, configurations and timings. HypoFuzz can run this test as a continuous fuzzer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.strategies import (
    HypothesisDelay,
    configs,
    conversation_trees,
    scenarios,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_default_scheduler_holds_every_invariant(data: st.DataObject) -> None:
    scenario = data.draw(scenarios())
    result = run_scenario(scenario, SimBackend(Timing(source=HypothesisDelay(data))))
    assert result.ok, result.violations[0].line()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_default_scheduler_holds_every_invariant_on_conversation_trees(
    data: st.DataObject,
) -> None:
    """Conversation trees on their own (the search draws one workload in four of them): prefixes
    split under the lock of a live turn and evicted around it, with drawn timings."""
    config = data.draw(configs())
    scenario = Scenario(
        "tree", config, data.draw(conversation_trees(max_seq_len=config.max_seq_len))
    )
    result = run_scenario(scenario, SimBackend(Timing(source=HypothesisDelay(data))))
    assert result.ok, result.violations[0].line()
