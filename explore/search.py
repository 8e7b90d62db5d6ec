"""The search: Hypothesis drives workloads, configurations and timings through the simulator.

A generated workload's failure is shrunk by the workload passes (`explore/reduce.py`); a named or
a user's scenario's by Hypothesis, and each invariant raises its own exception class, so that it
shrinks while keeping the same invariant broken. A time budget is honoured by running the search
in rounds of a few examples, each round with its own seed. While shrinking, every failure smaller
than the best so far is reported as it is found, and Ctrl-C or the budget ends the shrink with
that best one: a found bug is never lost.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, Timing
from overlapcheck.core.config import LoopKind, PolicyKind
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.database import DATABASE_KEY, example_choices, open_database
from overlapcheck.explore.reduce import reduce_failure, replay_runner
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.runner import DEFAULT_HANG_TIMEOUT, RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.watchdog import DeadlineReached
from overlapcheck.invariants.registry import check_specs
from overlapcheck.reference.faults import FAULTS
from overlapcheck.scenarios.named import named_scenario
from overlapcheck.scenarios.strategies import (
    HypothesisDelay,
    scenarios,
    variations,
)

_choice_order: Callable[[Any], tuple[Any, ...]] | None
try:  # Hypothesis's own order on examples; internal, hence the fallback below
    from hypothesis.internal.conjecture.shrinker import sort_key as _choice_order
except ImportError:  # pragma: no cover - another Hypothesis layout
    _choice_order = None


@contextmanager
def _examples_from_the_seed_alone() -> Iterator[None]:
    """Generation that depends on the seed and the strategies, not on which modules happen to be
    imported or what else ran in the process.

    NOTE: Hypothesis draws now and then from the literal constants of every "local" module in
    `sys.modules` (an editable install counts as local), through a process-wide cache of the
    constants each kind of draw permits. Importing one more module of ours changed the examples a
    seed gives: the mutation bench found `admit-beyond-slots` after 6 examples and shrank it in
    1.1 s, but after 17 and a 40 s shrink in a process that had imported `commands/explore.py`;
    any edit to any literal anywhere moved every search; and a cache filled by an earlier
    Hypothesis test changed a later search. During a search there are no local constants and the
    cache is the search's own. The hooks are internal: without them the search runs as before."""
    try:
        from hypothesis.internal.cache import LRUCache
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # pragma: no cover - another Hypothesis layout
        yield
        return
    found = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if found is None or cache is None:  # pragma: no cover
        yield
        return
    providers._get_local_constants = Constants  # an empty set of constants
    providers.CONSTANTS_CACHE = LRUCache(1024)
    try:
        yield
    finally:
        providers._get_local_constants = found
        providers.CONSTANTS_CACHE = cache


class Found(Exception):
    """A violation; subclassed per invariant (see `_found_class`). `choices`: the example as
    Hypothesis saves it in a database (what `SearchSpec.resume` replays); empty when this
    Hypothesis keeps it elsewhere."""

    def __init__(self, result: RunResult, draws: dict[int, float], choices: bytes = b"") -> None:
        super().__init__(result.violations[0].line())
        self.result = result
        self.draws = draws
        self.choices = choices


_FOUND: dict[str, type[Found]] = {}


def _found_class(invariant: str) -> type[Found]:
    if invariant not in _FOUND:
        name = "Found_" + invariant.replace("-", "_")
        _FOUND[invariant] = type(name, (Found,), {})
    return _FOUND[invariant]


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C before any failure was found; carries the totals so far (a KeyboardInterrupt still,
    for callers that do not care)."""

    def __init__(self, stats: SearchStats) -> None:
        super().__init__()
        self.stats = stats


class _BudgetCut(KeyboardInterrupt):
    """Raised at the end of an example once the budget ran out while shrinking. A
    KeyboardInterrupt because Hypothesis lets one through untouched: it neither records the
    example nor saves it to the database."""


class _ShrinkHandedOver(KeyboardInterrupt):
    """Raised at the end of an example once Hypothesis's shrinker has run `shrink_examples`
    examples: the workload passes (`explore/reduce.py`) finish the shrink. A KeyboardInterrupt,
    as `_BudgetCut`: Hypothesis lets it through untouched."""


class _Stopped(BaseException):
    """Raised at the end of an example to end the search: Hypothesis lets a BaseException through
    without shrinking or replaying it. (Raised any earlier, or an example cut short, the run
    draws less than the same prefix did before: Hypothesis calls that flaky data generation.)"""


@dataclass
class SearchStats:
    examples: int = 0
    iterations: int = 0
    rounds: int = 0
    seconds: float = 0.0
    first_failure: float | None = None  # seconds to the first violating example (before shrinking)
    examples_to_failure: int | None = None
    smaller: int = 0  # failures found while shrinking that were smaller than the best so far
    reduce_runs: int = 0  # runs of the workload passes that finished the shrink


# NOTE: Hypothesis's shrinker works on the choices an example was drawn from; on a failure that
# needs several requests under memory pressure it ran a thousand examples and more (evict-locked-
# node at seed 0: 968, 30 s of CPU), finding a smaller one now and then to the end. A generated
# workload's failure goes to the workload passes (`explore/reduce.py`) at once: they cut requests
# and fields directly, in at most REDUCE_RUNS runs (evict-locked-node: 53 runs, to the same three
# requests). A named or a user's scenario shrinks with Hypothesis: only it can shrink variations.
SHRINK_EXAMPLES = 0
REDUCE_RUNS = 150

CUT_INTERRUPTED = "interrupted"  # Ctrl-C while shrinking
CUT_BUDGET = "budget"  # the time budget ran out while shrinking
# Hypothesis could not run an example the same way twice (the scheduler's runs differ from one to
# the next: an order by object addresses, a clock, a global random source): the failure found
# first stands, unshrunk by Hypothesis. Never a bug of ours, nor a crash.
CUT_NONDETERMINISTIC = "nondeterministic"


@dataclass
class SearchResult:
    """`found`: the shrunk failure, or with `cut` set (`CUT_INTERRUPTED`, `CUT_BUDGET`) the
    smallest one seen before shrinking was cut short."""

    stats: SearchStats
    found: Found | None
    cut: str | None = None


def failure_order(data: st.DataObject, result: RunResult) -> tuple[Any, ...]:
    """How simple a failing example is, in Hypothesis's own order (fewer choices, then smaller
    ones): its shrinker keeps a candidate only when it is smaller in this order, so the smallest
    failure seen so far is the one it would report if it stopped now. Without that internal
    helper: the scenario's size (requests, then tokens, then iterations)."""
    if _choice_order is not None:
        return (0, _choice_order(data.conjecture_data.nodes))
    reqs = result.scenario.requests
    tokens = sum(len(r.prompt) + r.max_tokens for r in reqs)
    return (1, (len(reqs), tokens, result.iterations))


@dataclass(frozen=True, slots=True)
class SearchSpec:
    """What to search: one picklable value, so that worker processes and Ray tasks get the same.

    `scenario`: `all` (generated workloads), a named scenario, or a `Scenario` (from a user's
    file): variations of it are explored. `skip`: invariants not to check; `extra_checks`: opt-in
    ones (`bounded-wait=K`); `policy` pins the queue policy and `loop` the scheduler loop (else
    each is drawn with the rest of the configuration); `database`: a Hypothesis example database
    directory (None: in memory); `scheduler`: the scheduler under test; `round_size`: examples
    per Hypothesis run (the budget and the progress are checked between rounds).
    """

    scenario: str | Scenario = "all"
    faults: frozenset[str] = frozenset()
    budget: float = 60.0
    max_examples: int = 1000
    seed: int = 0
    profile: Profile = field(default_factory=Profile)
    database: str | None = None
    skip: frozenset[str] = frozenset()
    policy: PolicyKind | None = None
    extra_checks: tuple[str, ...] = ()
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    round_size: int = 25
    # Wall-clock seconds one step() may take before it is the finding `no-hang` (0: no limit).
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    # A saved example (`Found.choices`) to replay first and shrink from: `explore --resume`.
    resume: bytes = b""
    loop: LoopKind | None = None
    # Ranks of the scheduler run side by side (`core/ranks.py`); None: the scenario's, or 2
    # where a chosen fault is only reachable with several ranks.
    ranks: int | None = None
    # `explore --coverage` (`explore/coverage.py`): the scheduler's code files each stream
    # measures, and where its data go (None: not measured).
    coverage_files: tuple[str, ...] = ()
    coverage_data: str | None = None
    # Examples Hypothesis's shrinker may run on a generated workload's failure before the
    # workload passes (`explore/reduce.py`) take it over, and the runs those passes may take.
    shrink_examples: int = SHRINK_EXAMPLES
    reduce_runs: int = REDUCE_RUNS

    def __post_init__(self) -> None:
        # The scheduler is imported here, once per process (cached): a bad spec is one line
        # before any stream starts, not a failure in every worker or inside Hypothesis.
        self.scheduler.factory()

    @property
    def checks(self) -> list[str]:
        # Skipping `no-race` makes the search look for races that corrupt data (an oracle
        # failure), which needs the right timing: the counterexamples worth replaying on a GPU.
        return check_specs(self.skip, self.extra_checks)

    def strategy(self) -> st.SearchStrategy[Scenario]:
        if isinstance(self.scenario, Scenario):
            base = self.scenario
            if self.policy is not None:
                base = base.with_config(policy=self.policy)
            drawn = variations(base, self.faults)
        else:
            drawn = scenarios(self.scenario, self.faults, self.policy)
        loop, ranks = self.loop, self.pinned_ranks
        if self.scheduler.fits:  # only what the scheduler serves (its pool floor, ...)
            # Once first, outside any draw: a first fit may import the scheduler's code (an
            # adapter's upstream checkout), whose imports can touch the global `random`, which
            # Hypothesis warns of inside a strategy (seen in worker processes on Python 3.12).
            self.scheduler.fit(named_scenario("basic"))
            drawn = drawn.map(self.scheduler.fit)
        if ranks is not None:
            drawn = drawn.map(lambda scenario: scenario.with_config(num_ranks=ranks))
        if loop is None:
            return drawn
        # The loop is still drawn (and shrinks as before); a pinned one replaces the draw.
        return drawn.map(lambda scenario: scenario.with_config(loop=loop))

    @property
    def pinned_ranks(self) -> int | None:
        """The ranks every example runs (None: the scenario's, one for generated ones)."""
        if self.ranks is not None:
            return self.ranks
        one = not isinstance(self.scenario, Scenario) or self.scenario.config.num_ranks == 1
        return 2 if one and any(FAULTS[f].ranks for f in self.faults if f in FAULTS) else None

    def database_namespace(self) -> bytes:
        """What a saved example means: the same choices replay as the same test only under the
        same scenario, faults, checks, policy, scheduler and timing profile. The seed and the
        budgets are left out (streams and later runs share what they find); so is the
        scheduler's source hash (a rerun after a fix must replay the failure it fixed)."""
        scenario: Any = self.scenario
        if isinstance(scenario, Scenario):
            scenario = scenario.to_json()
        what = {
            "scenario": scenario,
            "faults": sorted(self.faults),
            "checks": self.checks,
            "policy": self.policy,
            "scheduler": self.scheduler.text,
            "profile": self.profile.as_dict(),
        }
        if self.loop is not None:
            what["loop"] = self.loop
        if self.pinned_ranks is not None:
            what["ranks"] = self.pinned_ranks
        text = json.dumps(what, sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=12).hexdigest().encode()

    def stream(self, index: int, streams: int) -> SearchSpec:
        """The spec of search stream `index` of `streams`: its own seed, its share of examples."""
        share = self.max_examples // streams + (index < self.max_examples % streams)
        return replace(
            self,
            seed=stream_seed(self.seed, index),
            max_examples=max(1, share),
            resume=self.resume if index == 0 else b"",  # one stream shrinks the saved example
        )

    def to_json(self) -> dict[str, Any]:
        """What a counterexample file records of the search that found it, beyond what it
        records anyway (faults, checks, scheduler, profile): enough for `explore --resume`."""
        scenario = self.scenario
        out: dict[str, Any] = {
            "scenario": scenario.to_json() if isinstance(scenario, Scenario) else scenario,
            "policy": self.policy,
        }
        if self.pinned_ranks is not None:
            out["ranks"] = self.pinned_ranks
        return out


def stream_seed(seed: int, index: int) -> int:
    """Stream 0 keeps `seed` (one stream searches as a single process does); the others get
    seeds far from it and from each other."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def run_example(
    scenario: Scenario,
    backend: SimBackend,
    checks: list[str] | None,
    scheduler: SchedulerSpec,
    hang_timeout: float | None = None,
    deadline: float | None = None,
) -> RunResult:
    """One run of the scheduler under test; a step past `hang_timeout` is `no-hang`, and one
    running at the `deadline` (`time.monotonic()`) raises `DeadlineReached`."""
    return run_scenario(
        scenario, backend, checks, scheduler=scheduler, hang_timeout=hang_timeout, deadline=deadline
    )


def basic_run(spec: SearchSpec) -> RunResult:
    """The scheduler under test built and run once on the `basic` scenario (nominal timing), as
    the search would run it."""
    basic = spec.scheduler.fit(named_scenario("basic"))
    if spec.loop is not None:  # a scheduler with only a normal loop is searched with it pinned
        basic = basic.with_config(loop=spec.loop)
    return run_example(basic, SimBackend(), spec.checks, spec.scheduler, spec.hang_timeout)


def probe_scheduler(spec: SearchSpec, probed: RunResult | None = None) -> list[str]:
    """Build and run the scheduler under test once (`basic_run`, or the run `probed` already
    made) before a search: a factory that fails or builds no scheduler is one UserError here,
    not a finding in every stream, and the checks it cannot have (no `books()`) are named once."""
    if spec.scheduler.is_reference:
        return []
    result = probed if probed is not None else basic_run(spec)
    return list(dict.fromkeys(result.notices))


def search(
    spec: SearchSpec,
    on_round: Callable[[SearchStats], None] | None = None,
    on_failure: Callable[[Found], bool] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_smaller: Callable[[Found], None] | None = None,
) -> SearchResult:
    """Search until a violation, `max_examples` examples, or `budget` seconds (checked per round;
    while shrinking, after every example).

    `on_round` sees the running totals after each round. `on_failure` is called once, with the
    first failing example before shrinking starts (save it: a kill during shrinking must not lose
    it); returning False drops the failure (another search stream already has one). `on_smaller`
    is called with each later failure smaller than the best so far (replace the saved one with
    it). `should_stop` is polled before each example: once it says so, the search winds down
    without running more. Ctrl-C or the budget during shrinking return the best so far, `cut`;
    Ctrl-C before any failure raises `SearchInterrupted` with the totals.
    """
    return _Search(spec, on_round, on_failure, should_stop, on_smaller).run()


class _Search:
    """One search under way: its totals, the smallest failure so far, and the rounds (Hypothesis
    runs of a few examples) that look for one.

    `example` is Hypothesis's test. It ends a round by raising: the failure (`Found`, which
    Hypothesis shrinks and raises again), or one of the signals above, which Hypothesis lets
    through untouched. `_round` turns what ended a round into the search's result.
    """

    def __init__(
        self,
        spec: SearchSpec,
        on_round: Callable[[SearchStats], None] | None,
        on_failure: Callable[[Found], bool] | None,
        should_stop: Callable[[], bool] | None,
        on_smaller: Callable[[Found], None] | None,
    ) -> None:
        self.spec = spec
        self.on_round = on_round
        self.on_failure = on_failure
        self.should_stop = should_stop
        self.on_smaller = on_smaller
        self.stats = SearchStats()
        self.started = time.perf_counter()
        # The budget bounds the search whatever the scheduler does: a step still running when it
        # runs out is stopped there (between examples it is checked as before).
        self.deadline = time.monotonic() + spec.budget
        self.database = open_database(spec.database, spec.database_namespace(), spec.resume)
        self.strategy = spec.strategy()
        self.checks = spec.checks
        self.dropped = False  # `on_failure` said another stream has one
        self.best: Found | None = None
        self.best_order: tuple[Any, ...] = ()

    def run(self) -> SearchResult:
        try:
            while (
                self.stats.examples < self.spec.max_examples
                and not self._over_budget()
                and not self._stopped()
            ):
                ended = self._round()
                if ended is not None:
                    return ended
        except KeyboardInterrupt:  # Ctrl-C, wherever it lands
            self.stats.seconds = self._elapsed()
            if self.best is None:
                raise SearchInterrupted(self.stats) from None
            return SearchResult(self.stats, self.best, cut=CUT_INTERRUPTED)
        return SearchResult(self.stats, None)

    def _round(self) -> SearchResult | None:
        """One round; the search's result if the round ended the search, else None."""
        test = self._hypothesis_test()
        self.stats.rounds += 1
        try:
            with _examples_from_the_seed_alone():
                test()
        except Found as found:
            return self._reported(found)
        except _Stopped:
            return SearchResult(self.stats, None)
        except _BudgetCut:
            assert self.best is not None
            return SearchResult(self.stats, self.best, cut=CUT_BUDGET)
        except _ShrinkHandedOver:
            assert self.best is not None
            return self._reported(self.best)
        except DeadlineReached:  # inside a long step: the example is not judged
            cut = CUT_BUDGET if self.best is not None else None
            return SearchResult(self.stats, self.best, cut=cut)
        except Flaky:  # the scheduler's run was not the same twice (see CUT_NONDETERMINISTIC)
            if self.best is None:
                return None  # nothing found yet: the next round, with its own seed
            reduced, _ = self._reduced(self.best)
            return SearchResult(self.stats, reduced, cut=CUT_NONDETERMINISTIC)
        finally:
            self.stats.seconds = self._elapsed()
            if self.on_round is not None:
                self.on_round(self.stats)
        return None

    def _hypothesis_test(self) -> Callable[[], None]:
        """The round's Hypothesis run: `example`, for the examples the search has left (at most
        `round_size`), from the round's own seed."""
        spec = self.spec
        test = given(st.data())(self.example)
        # Saved failures are found under the search's own key, not the digest of this code.
        setattr(test, "_hypothesis_internal_database_key", DATABASE_KEY)  # noqa: B010
        # NOTE: the seed goes on first: `@seed` turns the database off for the settings it finds,
        # and the settings applied after it keep ours (the streams share what they find).
        seeded = hypothesis_seed(spec.seed * 100_003 + self.stats.rounds)(test)
        return settings(
            max_examples=min(spec.round_size, spec.max_examples - self.stats.examples),
            deadline=None,
            database=self.database,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            # NOTE: no target phase. Its optimiser hill-climbs every choice of the example with
            # the best score in one pass per round, unbounded below 1,000 examples, and ends the
            # pass only then, failure found or not. Steering toward near races, it climbed the
            # longest runs (400 choices, 0.3 s each): free-slot-early found at example 40 waited
            # minutes for its shrink, and the named faults were found no sooner with it.
            phases=[Phase.reuse, Phase.generate, Phase.shrink],
            print_blob=False,
        )(seeded)

    def example(self, data: st.DataObject) -> None:
        """One example: a scenario and its timing drawn from `data`, run and judged."""
        profile = self.spec.profile
        scenario = data.draw(self.strategy, label="scenario")
        timing = Timing(profile, HypothesisDelay(data, profile.forward))
        result = self._run(scenario, timing)
        self.stats.examples += 1
        self.stats.iterations += result.iterations
        if self._stopped():
            raise _Stopped
        # (a run stops at its first violation; one that ends a run may be skipped: looked past)
        failed = bool(result.violations) and result.violations[0].invariant not in self.spec.skip
        found = self._failed(data, timing, result) if failed else None
        # NOTE: checked here, at the end of an example, so a cut never leaves one half drawn.
        if self.best is not None and self._over_budget():
            raise _BudgetCut
        if self._shrink_handed_over():
            raise _ShrinkHandedOver
        if found is not None:
            raise found

    def _run(self, scenario: Scenario, timing: Timing) -> RunResult:
        spec = self.spec
        backend = SimBackend(timing)
        try:
            return run_example(
                scenario, backend, self.checks, spec.scheduler, spec.hang_timeout, self.deadline
            )
        except CheckerBug as bug:  # ours, not the scheduler's: the CLI saves it, exit 3
            bug.extra.update(timing_draws=dict(timing.draws), scheduler=spec.scheduler.text)
            raise

    def _failed(self, data: st.DataObject, timing: Timing, result: RunResult) -> Found:
        """The failure `result` is, kept as the best if it is the first or smaller than the best
        (and told to `on_failure` or `on_smaller`)."""
        found = _found_class(result.violations[0].invariant)(
            result, dict(timing.draws), example_choices(data)
        )
        order = failure_order(data, result)
        if self.best is None:
            self.best, self.best_order = found, order
            self.stats.first_failure = self._elapsed()
            self.stats.examples_to_failure = self.stats.examples
            if self.on_failure is not None and not self.on_failure(found):
                self.dropped = True  # another stream found one first: end this one
                raise _Stopped
        elif order < self.best_order:
            self.best, self.best_order = found, order
            self._smaller(found)
        return found

    def _shrink_handed_over(self) -> bool:
        """Whether Hypothesis's shrinker has run its `shrink_examples` on a generated workload's
        failure: the workload passes finish the shrink. (At least one example after the failure:
        Hypothesis records a failure, and saves it to the database, only once the example that
        found it has raised.)"""
        to_failure = self.stats.examples_to_failure
        return (
            self.best is not None
            and self.spec.scenario == "all"
            and to_failure is not None
            and self.stats.examples - to_failure >= max(1, self.spec.shrink_examples)
        )

    def _reported(self, found: Found) -> SearchResult:
        reduced, over = self._reduced(found)
        return SearchResult(self.stats, reduced, cut=CUT_BUDGET if over else None)

    def _reduced(self, found: Found) -> tuple[Found, bool]:
        """The failure to report, cut further by the workload passes (each smaller one is
        reported like any smaller failure found while shrinking), and whether the budget ended
        them. A named or a user's scenario keeps its requests and fields: its variations are
        what was asked for."""
        spec = self.spec
        if spec.scenario != "all":
            return found, False

        def run(scenario: Scenario, backend: SimBackend) -> RunResult:
            return run_example(scenario, backend, self.checks, spec.scheduler, spec.hang_timeout)

        def smaller(result: RunResult, draws: dict[int, float]) -> None:
            self._smaller(type(found)(result, draws, found.choices))

        reduced = reduce_failure(
            found.result,
            found.draws,
            replay_runner(spec.profile, run),
            spec.reduce_runs,
            smaller,
            self._over_budget,
            admissible=spec.scheduler.serves,
        )
        self.stats.reduce_runs = reduced.runs
        if reduced.result is found.result:
            return found, reduced.stopped
        return type(found)(reduced.result, reduced.draws, found.choices), reduced.stopped

    def _smaller(self, found: Found) -> None:
        self.stats.smaller += 1
        if self.on_smaller is not None:
            self.on_smaller(found)

    def _stopped(self) -> bool:
        return self.dropped or (self.should_stop is not None and self.should_stop())

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _over_budget(self) -> bool:
        return self._elapsed() >= self.spec.budget
