"""The search: Hypothesis drives workloads, configurations and timings through the simulator.

Each invariant raises its own exception class, so Hypothesis shrinks a failure while keeping the
same invariant broken. A time budget is honoured by running the search in rounds of a few
examples, each round with its own seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, Timing
from overlapcheck.core.trace import Trace
from overlapcheck.invariants.registry import INVARIANTS
from overlapcheck.runner import RunResult, run_scenario
from overlapcheck.scenarios.strategies import HypothesisDelay, scenarios


class Found(Exception):
    """A violation; subclassed per invariant (see `_found_class`)."""

    def __init__(self, result: RunResult, draws: dict[int, float]) -> None:
        super().__init__(result.violations[0].line())
        self.result = result
        self.draws = draws


_FOUND: dict[str, type[Found]] = {}


def _found_class(invariant: str) -> type[Found]:
    if invariant not in _FOUND:
        name = "Found_" + invariant.replace("-", "_")
        _FOUND[invariant] = type(name, (Found,), {})
    return _FOUND[invariant]


@dataclass
class SearchStats:
    examples: int = 0
    iterations: int = 0
    rounds: int = 0
    seconds: float = 0.0
    first_failure: float | None = None  # seconds to the first violating example (before shrinking)
    examples_to_failure: int | None = None


@dataclass
class SearchResult:
    stats: SearchStats
    found: Found | None


def near_race_gap(trace: Trace) -> float | None:
    """Smallest gap (µs) between an engine forward ending and a scheduler-stream copy that started
    while the forward's batch was still unprocessed: how close this run came to reordering them."""
    gap: float | None = None
    last_end: float | None = None
    for op in trace.ops:
        if op.start is None or op.end is None:
            continue
        if op.kind == "forward":
            last_end = op.end
        elif op.agent == "scheduler" and op.kind == "h2d" and last_end is not None:
            g = abs(op.start - last_end) * 1e6
            gap = g if gap is None else min(gap, g)
    return gap


def check_list(skip: frozenset[str], extra: tuple[str, ...]) -> list[str] | None:
    """The invariant specs a run checks: the defaults less `skip`, plus opt-in ones (None: all)."""
    if not skip and not extra:
        return None
    return [i for i in INVARIANTS if i not in skip] + list(extra)


def search(
    scenario: str = "all",
    faults: frozenset[str] = frozenset(),
    budget: float = 60.0,
    max_examples: int = 1000,
    seed: int = 0,
    profile: Profile | None = None,
    database: ExampleDatabase | str | None = None,
    on_round: Callable[[SearchStats], None] | None = None,
    round_size: int = 25,
    skip: frozenset[str] = frozenset(),
    policy: str | None = None,
    extra_checks: tuple[str, ...] = (),
) -> SearchResult:
    """Search until a violation, `max_examples` examples, or `budget` seconds (checked per round).

    `skip`: invariants not to check (see below); `extra_checks`: opt-in ones (`bounded-wait=K`);
    `policy` pins the queue policy (else it is drawn with the rest of the configuration).
    """
    prof = profile or Profile()
    stats = SearchStats()
    started = time.perf_counter()
    db = DirectoryBasedExampleDatabase(database) if isinstance(database, str | Path) else database
    strategy = scenarios(scenario, faults, policy)
    # Skipping `no-race` makes the search look for races that corrupt data (an oracle failure),
    # which needs the right timing: the counterexamples worth replaying on a GPU.
    checks = check_list(skip, extra_checks)

    def example(data: st.DataObject) -> None:
        sc = data.draw(strategy, label="scenario")
        timing = Timing(prof, HypothesisDelay(data, prof.forward))
        result = run_scenario(sc, SimBackend(timing), checks)
        stats.examples += 1
        stats.iterations += result.iterations
        gap = near_race_gap(result.trace)
        if gap is not None:
            target(-gap, label="near-race gap (-µs)")
        if result.violations:
            if stats.first_failure is None:
                stats.first_failure = time.perf_counter() - started
                stats.examples_to_failure = stats.examples
            raise _found_class(result.violations[0].invariant)(result, dict(timing.draws))

    while stats.examples < max_examples and time.perf_counter() - started < budget:
        n = min(round_size, max_examples - stats.examples)
        test = settings(
            max_examples=n,
            deadline=None,
            database=db,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            phases=[Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            print_blob=False,
        )(given(st.data())(example))
        test = hypothesis_seed(seed * 100_003 + stats.rounds)(test)
        stats.rounds += 1
        try:
            test()
        except Found as found:
            stats.seconds = time.perf_counter() - started
            return SearchResult(stats, found)
        finally:
            stats.seconds = time.perf_counter() - started
            if on_round is not None:
                on_round(stats)
    return SearchResult(stats, None)
