"""Liveness: a host wait that can never return is reported (not hung on); a stuck run is bounded."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.device import DeadlockError, SimEvent
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import run_scenario
from overlapcheck.invariants.hbgraph import race_subgraph
from overlapcheck.reference.prefill import PrefillManager
from overlapcheck.scenarios.named import named_scenario


def test_a_host_wait_on_an_event_never_recorded_is_a_deadlock() -> None:
    scenario = named_scenario("basic")
    device = SimBackend().make_device(scenario)
    orphan = SimEvent(device, device.trace.new_event_id())  # never recorded on any stream
    with pytest.raises(DeadlockError, match="can never fire") as err:
        orphan.synchronize()
    assert err.value.invariant == "liveness"


def test_a_scheduler_that_never_admits_is_stopped_by_the_step_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(PrefillManager, "schedule", lambda self, *args, **kwargs: ([], []))
    scenario = Scenario("stuck", SchedulerConfig(), (RequestSpec(0, (5, 6), max_tokens=2),))
    result = run_scenario(scenario, SimBackend())
    assert [v.invariant for v in result.violations] == ["liveness"]
    assert "not idle after" in result.violations[0].message


def test_skipped_liveness_is_not_reported_from_the_step_bound_nor_a_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from overlapcheck.invariants.registry import INVARIANTS

    monkeypatch.setattr(PrefillManager, "schedule", lambda self, *args, **kwargs: ([], []))
    scenario = Scenario("stuck", SchedulerConfig(), (RequestSpec(0, (5, 6), max_tokens=2),))
    others = [name for name in INVARIANTS if name != "liveness"]
    result = run_scenario(scenario, SimBackend(), invariants=others)
    assert "liveness" not in [v.invariant for v in result.violations]


def test_race_subgraph_marks_both_operations_and_has_no_path_between_them() -> None:
    import networkx as nx

    scenario = named_scenario("single-slot").with_config(
        faults=frozenset(["copy-done-wrong-stream"])
    )
    result = run_scenario(scenario, SimBackend())
    v = result.violations[0]
    first, second = v.details["first"]["seq"], v.details["second"]["seq"]
    graph = race_subgraph(result.trace, first, second)
    assert graph.nodes[first]["race"] == "first" and graph.nodes[second]["race"] == "second"
    assert not nx.has_path(graph, first, second)
