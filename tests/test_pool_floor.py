"""A scheduler's declared pool floor (`core.protocol.serves_pools_from`): a search draws no pool
below it, and shrinking never cuts a pool below it; a factory without one is searched as before."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from test_reduce import _failing, _runner

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import (
    MessageSink,
    MessageSource,
    SchedulerUnderTest,
    pool_floor,
    serves_pools_from,
)
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.reduce import Run, reduce_failure
from overlapcheck.explore.search import SearchSpec
from overlapcheck.harness.runner import RunResult
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.reference.scheduler import Scheduler

FLOOR_PAGES = 20


def _floor(config: SchedulerConfig) -> int:
    return FLOOR_PAGES * config.page_size


def plain(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    return Scheduler(config, device, source, sink)


floored = serves_pools_from(_floor)(
    lambda config, device, source, sink: Scheduler(config, device, source, sink)
)


def test_a_factory_declares_its_floor_and_others_have_none() -> None:
    assert pool_floor(floored) is _floor
    assert pool_floor(plain) is None
    from overlapcheck.adapters import sglang

    for factory in (sglang.make_scheduler, sglang.make_cpu_scheduler):
        floor = pool_floor(factory)
        assert floor is not None
        # finding 3's pool (one page of 4 tokens) is below it; finding 1's (6 pages of 2) not
        assert floor(SchedulerConfig(num_pages=1, page_size=4)) > 4
        assert floor(SchedulerConfig(num_pages=6, page_size=2)) <= 12


def _pools(factory: object) -> list[int]:
    spec = SearchSpec(budget=3600, seed=5, scheduler=SchedulerSpec.of(factory))
    seen: list[int] = []

    @settings(
        max_examples=40,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(spec.strategy())
    def draw(scenario: Scenario) -> None:
        seen.append(scenario.config.num_pages)

    draw()
    return seen


def _smallest_pool(factory: object) -> int:
    return min(_pools(factory))


def test_a_search_draws_no_pool_below_the_declared_floor() -> None:
    # without the floor the generator draws pools below it; with it, never
    assert _smallest_pool(plain) < FLOOR_PAGES <= _smallest_pool(floored)


def _recording(pages: list[int]) -> Run:
    inner = _runner([])

    def run(scenario: Scenario, delays: dict[int, float]) -> tuple[RunResult, dict[int, float]]:
        pages.append(scenario.config.num_pages)
        return inner(scenario, delays)

    return run


def test_shrinking_never_runs_a_pool_below_the_floor() -> None:
    result, draws = _failing()
    floor_pages = result.scenario.config.num_pages // 2
    free: list[int] = []
    kept: list[int] = []
    reduce_failure(result, draws, _recording(free), 200)
    reduced = reduce_failure(
        result,
        draws,
        _recording(kept),
        200,
        admissible=lambda s: s.config.num_pages >= floor_pages,
    )
    assert min(free) < floor_pages  # without it the passes cut the pool further
    assert min(kept) >= floor_pages
    assert reduced.result.violations[0].invariant == result.violations[0].invariant
