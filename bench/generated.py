"""The loop the measurement benches share: a scheduler run over generated examples (the search's
own strategy, drawn timings), in Hypothesis's generate phase only, seeded and without a database,
so that the same count and seed give the same examples in any process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.core.protocol import SchedulerFactory
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.scenarios.strategies import HypothesisDelay, scenarios


class Example(NamedTuple):
    """One generated example, run: `timing` holds the delays it drew (a counterexample's)."""

    result: RunResult
    timing: Timing


def each_example(
    count: int,
    seed: int,
    visit: Callable[[Example], None],
    scheduler: SchedulerFactory | None = None,
    adjust: Callable[[st.DataObject, Scenario], Scenario] | None = None,
) -> int:
    """Run `scheduler` (default: the reference) over `count` generated examples, `adjust`ing each
    drawn scenario first; `visit` sees each run. Returns how many ran."""
    ran = 0

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def example(data: st.DataObject) -> None:
        nonlocal ran
        scenario = data.draw(scenarios())
        if adjust is not None:
            scenario = adjust(data, scenario)
        timing = Timing(source=HypothesisDelay(data))
        result = run_scenario(scenario, SimBackend(timing), scheduler=scheduler)
        visit(Example(result, timing))
        ran += 1

    example()
    return ran
