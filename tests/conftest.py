"""Shared helpers for the tests."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.runner import RunResult, run_scenario
from overlapcheck.scenarios.scenario import Scenario


def run_sim(scenario: Scenario, invariants: list[str] | None = None) -> RunResult:
    return run_scenario(scenario, SimBackend(), invariants)


@pytest.fixture
def sim() -> object:
    return run_sim
