"""CUDA graphs as a config switch: the generator draws it, scenario files carry it (the padded
batch in a mini-sglang trace: `tests/test_minisgl.py`, which owns the process's one checkout)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, settings

pytest.importorskip("torch")

from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict
from overlapcheck.scenarios.strategies import generated_scenarios

SLOTS = 3


def test_the_generator_draws_graphs_and_shrinks_them_away() -> None:
    found = find(
        generated_scenarios(),
        lambda s: bool(s.config.cuda_graph_bs),
        settings=settings(database=None, suppress_health_check=list(HealthCheck)),
    )
    assert found.config.cuda_graph_bs
    off = find(
        generated_scenarios(),
        lambda s: True,
        settings=settings(database=None, suppress_health_check=list(HealthCheck)),
    )
    assert off.config.cuda_graph_bs == ()


def test_scenario_files_carry_the_sizes_and_reject_bad_ones() -> None:
    raw = {"config": {"cuda_graph_bs": [1, 2, 4]}, "requests": [{"uid": 0, "prompt": [5]}]}
    scenario = scenario_from_dict(raw)
    assert scenario.config.cuda_graph_bs == (1, 2, 4)
    assert scenario_from_dict(scenario.to_json()).config == scenario.config
    assert "cuda_graph_bs" not in scenario.with_config(cuda_graph_bs=()).to_json()["config"]
    with pytest.raises(ScenarioError, match="cuda_graph_bs"):
        scenario_from_dict({**raw, "config": {"cuda_graph_bs": 4}})
    with pytest.raises(ConfigError, match="cuda_graph_bs"):
        SchedulerConfig(cuda_graph_bs=(0,))
