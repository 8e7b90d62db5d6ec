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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import Flaky

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, Timing
from overlapcheck.core.config import LoopKind, PolicyKind
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.reduce import reduce_failure, replay_runner
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.runner import DEFAULT_HANG_TIMEOUT, RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.watchdog import DeadlineReached
from overlapcheck.invariants.registry import check_specs
from overlapcheck.reference.faults import FAULTS
from overlapcheck.scenarios.named import named_scenario
from overlapcheck.scenarios.strategies import HypothesisDelay, scenarios, variations

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


def example_choices(data: st.DataObject) -> bytes:
    """The example's choices as Hypothesis stores them in a database (internal; b"" without)."""
    try:
        from hypothesis.database import choices_to_bytes
    except ImportError:  # pragma: no cover - another Hypothesis layout
        return b""
    conjecture = getattr(data, "conjecture_data", None)
    choices = getattr(conjecture, "choices", None)
    return b"" if choices is None else choices_to_bytes(choices)


class ResumeDatabase(ExampleDatabase):
    """A database that offers one saved example first wherever Hypothesis looks for the failures
    it should replay (the primary corpus of any test), then what `inner` holds: a search resumed
    from a counterexample file replays that file's example, fails at once and shrinks from it."""

    def __init__(self, choices: bytes, inner: ExampleDatabase | None) -> None:
        super().__init__()
        self.choices = choices
        self.inner = inner

    @staticmethod
    def _primary(key: bytes) -> bool:
        return not key.endswith((b".secondary", b".pareto"))

    def save(self, key: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self._primary(key):
            yield self.choices
        if self.inner is not None:
            yield from (v for v in self.inner.fetch(key) if v != self.choices)

    def delete(self, key: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.move(src, dest, value)


class FailureDatabase(ExampleDatabase):
    """A directory example database that keeps failures (Hypothesis's primary and secondary
    corpora) and drops any pareto front of `target()` scores (the search observes none now; a
    front is replayed at the start of every run, and a search runs in rounds of a few
    examples: replaying it once cost a third of the search's throughput).

    Every key is prefixed with `namespace` (`SearchSpec.database_namespace`): Hypothesis keys
    examples by the test function alone, and the search's function is the same for every fault
    set, scenario and scheduler. Unprefixed, a run with other faults replayed the saved failures
    of the last one, found they pass, and deleted them from the database."""

    def __init__(self, path: str, namespace: bytes = b"") -> None:
        super().__init__()
        self.inner = DirectoryBasedExampleDatabase(path)
        self.namespace = namespace

    def _key(self, key: bytes) -> bytes:
        return self.namespace + b":" + key if self.namespace else key

    def save(self, key: bytes, value: bytes) -> None:
        if not key.endswith(b".pareto"):
            self.inner.save(self._key(key), value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if key.endswith(b".pareto"):
            return iter(())
        return self.inner.fetch(self._key(key))

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self._key(key), value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if dest.endswith(b".pareto"):
            self.inner.delete(self._key(src), value)
        else:
            self.inner.move(self._key(src), self._key(dest), value)


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


def probe_scheduler(spec: SearchSpec) -> list[str]:
    """Build and run the scheduler under test once (the `basic` scenario, nominal timing) before
    a search: a factory that fails or builds no scheduler is one UserError here, not a finding
    in every stream, and the checks it cannot have (no `books()`) are named once."""
    if spec.scheduler.is_reference:
        return []
    basic = named_scenario("basic")
    if spec.loop is not None:  # a scheduler with only a normal loop is searched with it pinned
        basic = basic.with_config(loop=spec.loop)
    result = run_example(basic, SimBackend(), spec.checks, spec.scheduler, spec.hang_timeout)
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
    prof = spec.profile
    stats = SearchStats()
    started = time.perf_counter()
    # The budget bounds the search whatever the scheduler does: a step still running when it
    # runs out is stopped there (between examples it is checked as before).
    deadline = time.monotonic() + spec.budget
    db: ExampleDatabase | None = None
    if spec.database is not None:
        db = FailureDatabase(spec.database, spec.database_namespace())
    if spec.resume:
        db = ResumeDatabase(spec.resume, db)
    strategy = spec.strategy()
    checks = spec.checks
    dropped = False
    best: Found | None = None
    best_order: tuple[Any, ...] = ()

    def finished(found: Found) -> tuple[Found, bool]:
        """The failure to report, cut further by the workload passes (each smaller one is
        reported like any smaller failure found while shrinking), and whether the budget ended
        them. A named or a user's scenario keeps its requests and fields: its variations are
        what was asked for."""
        if spec.scenario != "all":
            return found, False
        run = replay_runner(
            prof,
            lambda sc, backend: run_example(sc, backend, checks, spec.scheduler, spec.hang_timeout),
        )

        def smaller(result: RunResult, draws: dict[int, float]) -> None:
            stats.smaller += 1
            if on_smaller is not None:
                on_smaller(type(found)(result, draws, found.choices))

        def over_budget() -> bool:
            return time.perf_counter() - started >= spec.budget

        reduced = reduce_failure(
            found.result, found.draws, run, spec.reduce_runs, smaller, over_budget
        )
        stats.reduce_runs = reduced.runs
        if reduced.result is found.result:
            return found, reduced.stopped
        return type(found)(reduced.result, reduced.draws, found.choices), reduced.stopped

    def stopped() -> bool:
        return dropped or (should_stop is not None and should_stop())

    def example(data: st.DataObject) -> None:
        nonlocal dropped, best, best_order
        sc = data.draw(strategy, label="scenario")
        timing = Timing(prof, HypothesisDelay(data, prof.forward))
        try:
            result = run_example(
                sc, SimBackend(timing), checks, spec.scheduler, spec.hang_timeout, deadline
            )
        except CheckerBug as bug:  # ours, not the scheduler's: the CLI saves it, exit 3
            bug.extra.update(timing_draws=dict(timing.draws), scheduler=spec.scheduler.text)
            raise
        stats.examples += 1
        stats.iterations += result.iterations
        if stopped():
            raise _Stopped
        found: Found | None = None
        if result.violations:
            found = _found_class(result.violations[0].invariant)(
                result, dict(timing.draws), example_choices(data)
            )
            order = failure_order(data, result)
            if best is None:
                best, best_order = found, order
                stats.first_failure = time.perf_counter() - started
                stats.examples_to_failure = stats.examples
                if on_failure is not None and not on_failure(found):
                    dropped = True  # another stream found one first: end this one
                    raise _Stopped
            elif order < best_order:
                best, best_order = found, order
                stats.smaller += 1
                if on_smaller is not None:
                    on_smaller(found)
        # NOTE: checked here, at the end of an example, so a cut never leaves one half drawn.
        if best is not None and time.perf_counter() - started >= spec.budget:
            raise _BudgetCut
        # (at least one example after the failure: Hypothesis records a failure, and saves it
        # to the database, only once the example that found it has raised)
        if (
            best is not None
            and spec.scenario == "all"
            and stats.examples_to_failure is not None
            and stats.examples - stats.examples_to_failure >= max(1, spec.shrink_examples)
        ):
            raise _ShrinkHandedOver
        if found is not None:
            raise found

    try:
        while (
            stats.examples < spec.max_examples
            and time.perf_counter() - started < spec.budget
            and not stopped()
        ):
            n = min(spec.round_size, spec.max_examples - stats.examples)
            # NOTE: the seed goes on first: `@seed` turns the database off for the settings it
            # finds, and the settings applied after it keep ours (the streams share what they
            # find).
            seed = spec.seed * 100_003 + stats.rounds
            seeded = hypothesis_seed(seed)(given(st.data())(example))
            test = settings(
                max_examples=n,
                deadline=None,
                database=db,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
                # NOTE: no target phase. Its optimiser hill-climbs every choice of the example
                # with the best score in one pass per round, unbounded below 1,000 examples,
                # and ends the pass only then, failure found or not. Steering toward near
                # races, it climbed the longest runs (400 choices, 0.3 s each): free-slot-early
                # found at example 40 waited minutes for its shrink, and the named faults were
                # found no sooner with it.
                phases=[Phase.reuse, Phase.generate, Phase.shrink],
                print_blob=False,
            )(seeded)
            stats.rounds += 1
            try:
                with _examples_from_the_seed_alone():
                    test()
            except Found as found:
                result_found, over = finished(found)
                stats.seconds = time.perf_counter() - started
                return SearchResult(stats, result_found, cut=CUT_BUDGET if over else None)
            except _Stopped:
                break
            except _BudgetCut:
                assert best is not None
                return SearchResult(stats, best, cut=CUT_BUDGET)
            except _ShrinkHandedOver:
                assert best is not None
                result_found, over = finished(best)
                stats.seconds = time.perf_counter() - started
                return SearchResult(stats, result_found, cut=CUT_BUDGET if over else None)
            except DeadlineReached:  # inside a long step: the example is not judged
                return SearchResult(stats, best, cut=CUT_BUDGET if best is not None else None)
            except Flaky:  # the scheduler's run was not the same twice (see CUT_NONDETERMINISTIC)
                if best is None:
                    continue  # nothing found yet: the next round, with its own seed
                result_found, _ = finished(best)
                stats.seconds = time.perf_counter() - started
                return SearchResult(stats, result_found, cut=CUT_NONDETERMINISTIC)
            finally:
                stats.seconds = time.perf_counter() - started
                if on_round is not None:
                    on_round(stats)
    except KeyboardInterrupt:  # Ctrl-C, wherever it lands
        stats.seconds = time.perf_counter() - started
        if best is None:
            raise SearchInterrupted(stats) from None
        return SearchResult(stats, best, cut=CUT_INTERRUPTED)
    return SearchResult(stats, None)
