"""A factory's `fit_scenario` (`core/protocol.py`): the nearest workload its scheduler serves.
A search maps every drawn workload through it, so nothing is reported on a workload the
scheduler cannot take (an engine's older version with one page size only, or no aborts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import NAMED


class OnePageSizeOnly:
    """The reference scheduler, as if it had pages of one token and no CUDA graphs only."""

    def __init__(self) -> None:
        self.built: list[SchedulerConfig] = []

    def __call__(self, config: SchedulerConfig, *rest: Any) -> Scheduler:
        assert config == _fit(config), "a configuration the factory cannot run"
        self.built.append(config)
        return Scheduler(config, *rest)

    def fit_scenario(self, scenario: Scenario) -> Scenario:
        return replace(scenario, config=_fit(scenario.config))


def _fit(config: SchedulerConfig) -> SchedulerConfig:
    tokens = config.num_pages * config.page_size
    return replace(config, page_size=1, num_pages=tokens, cuda_graph_bs=())


def test_a_search_draws_only_configurations_the_scheduler_can_run() -> None:
    factory = OnePageSizeOnly()
    spec = SchedulerSpec.of(factory)
    result = search(SearchSpec(budget=600, max_examples=20, seed=5, scheduler=spec))
    assert result.found is None and len(factory.built) >= 20
    assert {c.page_size for c in factory.built} == {1}
    assert all(not c.cuda_graph_bs for c in factory.built)
    # (the draws themselves had larger pages: the fit kept the pool's tokens)
    assert len({c.num_pages for c in factory.built}) > 3


def test_a_scenario_is_fitted_only_when_its_scheduler_says_so() -> None:
    basic = NAMED["basic"]()
    paged = basic.with_config(page_size=4, num_pages=8)
    fitted = SchedulerSpec.of(OnePageSizeOnly()).fit(paged)
    assert (fitted.config.page_size, fitted.config.num_pages) == (1, 32)
    assert fitted.requests == paged.requests
    assert SchedulerSpec().fit(paged) is paged  # the reference has no fit_scenario
