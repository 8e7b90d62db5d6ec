"""Queue policies: each one's order on hand-built queues and trees, the fallbacks, in-batch prefix
deprioritisation, determinism; every policy keeps every invariant (named scenarios and a quick
search); the opt-in `bounded-wait` check separates `lpm` from `fcfs`, `hrrn` and `lpm-aging`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.cli import main as cli_main
from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.core.messages import SamplingParams
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.fairness import BoundedWait
from overlapcheck.invariants.registry import INVARIANTS, make_invariants
from overlapcheck.reference.cache.naive import NaiveCache
from overlapcheck.reference.cache.prompt_tree import PromptTree
from overlapcheck.reference.cache.radix import RadixCache
from overlapcheck.reference.policy import CACHE_AWARE, POLICIES, make_policy
from overlapcheck.reference.req import Req
from overlapcheck.scenarios.fairness import VICTIM, hit_stream, queued_scenarios
from overlapcheck.scenarios.loader import load_scenario_file
from overlapcheck.scenarios.named import NAMED, named_scenario
from overlapcheck.scenarios.strategies import HypothesisDelay, scenarios

DOCS = Path(__file__).resolve().parent.parent / "docs"
APPLE, PHONE, COMPUTER, BANANA, MILK = 10, 11, 12, 13, 14


def req(uid: int, prompt: tuple[int, ...], max_tokens: int = 4, arrival_step: int = 0) -> Req:
    return Req(uid, prompt, SamplingParams(max_tokens=max_tokens), max_tokens, arrival_step)


def radix(*cached: tuple[int, ...], page_size: int = 1) -> RadixCache:
    cache = RadixCache(page_size)
    nxt = 0
    for tokens in cached:
        cache.insert(tokens, list(range(nxt, nxt + len(tokens))))
        nxt += len(tokens)
    return cache


def order(
    policy: str, queue: list[Req], tree: RadixCache | None = None, step: int = 0, **config: object
) -> list[int]:
    cfg = SchedulerConfig(policy=policy, **config)  # type: ignore[arg-type]
    return [r.uid for r in make_policy(cfg, tree or radix()).order(queue, step)]


def long(start: int, n: int = 40) -> tuple[int, ...]:
    return tuple(range(start, start + n))


# -- orders on hand-built queues ------------------------------------------------------------------


def test_every_policy_is_implemented() -> None:
    for policy in POLICIES:
        assert make_policy(SchedulerConfig(policy=policy), radix()).name == policy
    assert set(CACHE_AWARE) < set(POLICIES)


def test_fcfs_keeps_arrival_order() -> None:
    queue = [req(u, (u + 3, 9)) for u in range(5)]
    assert order("fcfs", queue, radix((8, 7, 9))) == [0, 1, 2, 3, 4]


def test_lof_sorts_by_max_tokens_ties_in_arrival_order() -> None:
    queue = [req(0, (3, 4), 2), req(1, (3, 5), 9), req(2, (3, 6), 2), req(3, (3, 7), 9)]
    assert order("lof", queue) == [1, 3, 0, 2]


def test_random_is_a_permutation_that_depends_only_on_the_seed() -> None:
    queue = [req(u, (u + 3, 9)) for u in range(12)]

    def passes(seed: int) -> list[list[int]]:
        policy = make_policy(SchedulerConfig(policy="random", seed=seed), radix())
        return [[r.uid for r in policy.order(queue, s)] for s in range(3)]

    assert passes(7) == passes(7)
    assert passes(7) != passes(8)
    assert all(sorted(p) == list(range(12)) for p in passes(7))
    assert passes(7)[0] != passes(7)[1]  # the policy's own generator moves on between passes


def test_lpm_longest_cached_match_first_ties_in_arrival_order() -> None:
    cache = radix((1, 2, 3, 4, 5, 6), (7, 8))
    queue = [
        req(0, (9, 9, 9)),  # no match
        req(1, (1, 2, 3, 4, 0, 0)),  # 4
        req(2, (7, 8, 0)),  # 2
        req(3, (1, 2, 3, 4, 5, 6, 0)),  # 6
        req(4, (7, 8, 1)),  # 2
    ]
    assert order("lpm", queue, cache) == [3, 1, 2, 4, 0]


def test_lpm_lookups_have_no_side_effect_on_the_cache() -> None:
    cache = radix((1, 2, 3, 4, 5, 6))
    node = cache.root.children[(1,)]
    before = (node.key, node.last_access, cache._clock, len(cache._nodes()))
    queue = [req(0, (1, 2, 3, 9, 9)), req(1, (1, 2, 9))]
    assert order("lpm", queue, cache) == [0, 1]
    assert (node.key, node.last_access, cache._clock, len(cache._nodes())) == before
    assert cache.peek((1, 2, 3, 9)) == cache.match((1, 2, 3, 9)).length == 3


def test_peek_is_page_aligned() -> None:
    cache = radix((1, 2, 3, 4, 5, 6), page_size=2)
    assert cache.peek((1, 2, 3, 9, 9)) == 2
    assert cache.peek((1, 2, 3, 4, 5)) == 4
    assert cache.peek((1, 2, 3, 4, 5, 6, 7)) == 6


def test_lpm_falls_back_to_fcfs_above_the_queue_length_threshold() -> None:
    cache = radix((1, 2, 3))

    def queue(n: int) -> list[Req]:  # the only hit waits last
        return [req(u, (50 + u, 9)) for u in range(n - 1)] + [req(n - 1, (1, 2, 3, 9))]

    for policy in ("lpm", "hrrn", "lpm-aging"):
        at = order(policy, queue(8), cache, step=1, lpm_fallback_queue_len=8)
        above = order(policy, queue(9), cache, step=1, lpm_fallback_queue_len=8)
        assert at[0] == 7, policy  # 8 waiting: sorted
        assert above == list(range(9)), policy  # 9 > 8 waiting: arrival order
    assert order("lpm", queue(129), cache)[0] == 0  # the default threshold is 128
    assert order("lpm", queue(128), cache)[0] == 127
    # dfs-weight never falls back
    assert order("dfs-weight", queue(9), cache, lpm_fallback_queue_len=8)[0] == 8


def test_dfs_weight_example_from_the_issue() -> None:
    # The tree: apple (phone, computer) weighs 3, banana (milk) weighs 2.
    cache = radix((APPLE, PHONE), (APPLE, COMPUTER), (BANANA, MILK))
    queue = [
        req(0, (APPLE, 1)),
        req(1, (APPLE, PHONE, 1)),
        req(2, (APPLE, COMPUTER, 1)),
        req(3, (BANANA, 1)),
        req(4, (BANANA, MILK, 1)),
    ]
    # apple phone, apple computer, apple, banana milk, banana
    assert order("dfs-weight", queue, cache) == [1, 2, 0, 4, 3]
    # Heavier subtrees first whatever the arrival order; ties in the tree's order (phone was
    # cached before computer), as SGLang's `_dfs_weight_order`.
    assert order("dfs-weight", [queue[i] for i in (3, 4, 0, 1, 2)], cache) == [1, 2, 0, 4, 3]
    assert order("dfs-weight", [queue[i] for i in (2, 1, 0)], cache) == [1, 2, 0]


def test_dfs_weight_on_matches_that_end_inside_an_edge() -> None:
    # One cached edge 1..6: matches of 2 and 4 tokens end inside it, where `match` would split it.
    cache = radix((1, 2, 3, 4, 5, 6, 7))
    queue = [
        req(0, (1, 2, 0)),
        req(1, (1, 2, 3, 4, 0)),
        req(2, (9, 9)),
        req(3, (1, 2, 3, 4, 5, 6, 7, 0)),
        req(4, (1, 2, 3, 4, 9)),
    ]
    assert order("dfs-weight", queue, cache) == [3, 1, 4, 0, 2]
    # Under one node, the heavier branch first: (1 2 3 ...) holds two requests, (1 2 7) one.
    cache = radix((1, 2, 3, 4), (1, 2, 7, 8))
    queue = [req(0, (1, 2, 7, 0)), req(1, (1, 2, 3, 0)), req(2, (1, 2, 3, 4, 0)), req(3, (1, 2, 0))]
    assert order("dfs-weight", queue, cache) == [2, 1, 0, 3]


def test_dfs_weight_handles_a_long_chain_without_recursion() -> None:
    n = 1100  # deeper than Python's recursion limit
    cache = radix(*(tuple(range(3, 3 + k)) for k in range(1, n + 1)))  # a chain of n nodes
    queue = [req(k, tuple(range(3, 3 + k)) + (1,)) for k in range(1, n + 1)]
    assert order("dfs-weight", queue, cache) == list(range(n, 0, -1))  # deepest first


def test_hrrn_response_ratio_in_passes() -> None:
    cache = radix(long(100, 32))
    # (waited + uncached/chunk) / (uncached/chunk), chunk = 8 tokens per pass:
    queue = [
        req(0, long(500, 64), arrival_step=0),  # waited 8, 64 uncached: (8+8)/8 = 2
        req(1, long(600, 8), arrival_step=6),  # waited 2, 8 uncached: (2+1)/1 = 3
        req(2, long(100, 32) + long(700, 16), arrival_step=6),  # 16 uncached: (2+2)/2 = 2
        req(3, long(800, 16), arrival_step=8),  # waited 0: 1
    ]
    assert order("hrrn", queue, cache, step=8, max_extend_tokens=8) == [1, 0, 2, 3]


def test_lpm_aging_lets_a_cache_miss_catch_up() -> None:
    cache = radix(long(100, 32))
    miss = req(0, long(500, 20), arrival_step=0)
    hit = req(1, long(100, 32) + (7, 7), arrival_step=4)
    # key = match + 4 x waited: miss 4 x w, hit 32 + 4 x (w - 4), so the hit leads by 16 tokens.
    assert order("lpm-aging", [miss, hit], cache, step=5) == [1, 0]
    assert order("lpm-aging", [miss, hit], cache, step=5, aging_tokens_per_pass=8) == [0, 1]
    assert order("lpm-aging", [miss, hit], cache, step=5, aging_tokens_per_pass=12) == [0, 1]
    assert order("lpm", [miss, hit], cache, step=500) == [1, 0]


def test_cache_aware_policies_run_as_fcfs_on_the_naive_cache() -> None:
    shared = long(200)
    queue = [req(0, (9, 9)), req(1, (1, 2, 3, 4)), req(2, shared + (1,)), req(3, shared + (2,))]
    for policy in CACHE_AWARE:
        cfg = SchedulerConfig(policy=policy, cache="naive")
        assert make_policy(cfg, NaiveCache()).name == "fcfs"
        assert [r.uid for r in make_policy(cfg, NaiveCache()).order(queue, 5)] == [0, 1, 2, 3]
    # The whole run is the fcfs run, operation for operation.
    base = named_scenario("memory-pressure").with_config(cache="naive")
    fcfs = run_scenario(base, SimBackend()).trace_hash
    for policy in CACHE_AWARE:
        assert run_scenario(base.with_config(policy=policy), SimBackend()).trace_hash == fcfs


# -- in-batch prefix deprioritisation ------------------------------------------------------------


def test_deprioritise_the_second_of_two_requests_sharing_a_long_uncached_prefix() -> None:
    shared = long(200)
    queue = [req(0, shared + (1, 1)), req(1, shared + (2, 2)), req(2, (7, 8, 9))]
    for policy in ("lpm", "hrrn", "lpm-aging"):
        assert order(policy, queue, step=0) == [0, 2, 1], policy
    # dfs-weight ignores the deprioritised set; fcfs knows nothing of it.
    assert order("dfs-weight", queue) == [0, 1, 2]
    assert order("fcfs", queue) == [0, 1, 2]


def test_deprioritisation_thresholds() -> None:
    shared = long(200, 31)  # 31 tokens shared: under the threshold of 32
    queue = [req(0, shared + (1, 1)), req(1, shared + (2, 2)), req(2, (7, 8, 9))]
    assert order("lpm", queue) == [0, 1, 2]
    assert order("lpm", queue, in_batch_deprioritize_threshold=31) == [0, 2, 1]
    # A request whose cached match is long is not checked: it reuses the cache already.
    cached = radix(long(200, 40))
    queue = [req(0, long(200, 40) + (1, 1)), req(1, long(200, 40) + (2, 2)), req(2, (7, 8, 9))]
    assert order("lpm", queue, cached) == [0, 1, 2]
    assert order("lpm", queue, cached, in_batch_check_threshold=40) == [0, 2, 1]
    assert order(
        "lpm", [req(0, long(200) + (1,)), req(1, long(200) + (2,))], in_batch_check_threshold=-1
    ) == [0, 1]


def test_deprioritised_request_reuses_the_prefix_in_a_later_round() -> None:
    """Two requests share 40 uncached tokens and one slot frees at a time: under `lpm` the second
    one waits for the first to cache the prefix instead of computing it in the same batch."""
    shared = long(100)
    specs = (
        RequestSpec(0, shared + (1, 2), max_tokens=2),
        RequestSpec(1, shared + (3, 4), max_tokens=2),
        RequestSpec(2, long(300, 8), max_tokens=30),
    )
    scenario = Scenario("shared-uncached", SchedulerConfig(num_slots=2), specs)
    fcfs = run_scenario(scenario, SimBackend())
    lpm = run_scenario(scenario.with_config(policy="lpm"), SimBackend())
    assert fcfs.ok and lpm.ok
    assert fcfs.scheduler is not None and lpm.scheduler is not None
    assert fcfs.scheduler.prefill.cached_tokens == 0
    assert lpm.scheduler.prefill.cached_tokens >= 40


def test_prompt_tree() -> None:
    tree = PromptTree()
    assert tree.shared((1, 2, 3)) == 0
    tree.insert((1, 2, 3, 4))
    tree.insert((1, 2, 5))
    tree.insert((7,))
    assert [tree.shared(t) for t in ((1, 2, 3, 4, 5), (1, 2, 5, 6), (1, 9), (7, 7), (8,))] == [
        4,
        3,
        1,
        1,
        0,
    ]


def test_config_validation() -> None:
    for bad in (
        {"policy": "sjf"},
        {"lpm_fallback_queue_len": -1},
        {"in_batch_check_threshold": -2},
        {"in_batch_deprioritize_threshold": 0},
        {"aging_tokens_per_pass": -1},
    ):
        with pytest.raises(ConfigError):
            SchedulerConfig(**bad)  # type: ignore[arg-type]


# -- safety under every policy -------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(NAMED))
def test_named_scenarios_match_the_reference_under_every_policy(name: str, policy: str) -> None:
    base = named_scenario(name)
    for chunk in (base.config.max_extend_tokens, 4):
        scenario = base.with_config(policy=policy, max_extend_tokens=chunk)
        result = run_scenario(scenario, SimBackend())
        assert result.ok, [v.line() for v in result.violations]
        for outcome in result.outcomes:
            reference = result_reference(result, outcome.uid)
            if outcome.finish_reason == "abort":
                assert outcome.tokens == reference[: len(outcome.tokens)]
            else:
                assert outcome.tokens == reference, (name, policy, outcome.uid)


def result_reference(result: RunResult, uid: int) -> list[int]:
    from overlapcheck.backends.sim.toy_model import ToyModel
    from overlapcheck.core.rules import max_output
    from overlapcheck.core.scenario import user_msg

    cfg = result.config
    model = ToyModel(cfg.vocab_size, cfg.eos_token_id, cfg.seed)
    for spec in result.scenario.requests:
        if spec.continuation:
            model.add_script(spec.prompt, spec.continuation)
    spec = next(s for s in result.scenario.requests if s.uid == uid)
    return model.generate(spec.prompt, max_output(cfg, user_msg(spec)), spec.ignore_eos)


@pytest.mark.parametrize("policy", POLICIES)
def test_quick_search_every_invariant_holds(policy: str) -> None:
    """Queues with cache hits and misses (where the policy has choices), generated workloads and
    variations of the named ones, with timings, under `policy`; under `fcfs` also bounded-wait=0."""
    checks = [*INVARIANTS, "bounded-wait=0"] if policy == "fcfs" else None
    anything = scenarios().map(lambda s: s.with_config(policy=policy))

    @settings(
        max_examples=30,  # per policy: seven policies, and the long searches are marked slow
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(queued_scenarios(policy), anything), st.data())
    def search(sc: Scenario, data: st.DataObject) -> None:
        result = run_scenario(sc, SimBackend(Timing(source=HypothesisDelay(data))), checks)
        assert result.ok, [v.line() for v in result.violations]

    search()


def test_policies_are_deterministic() -> None:
    scenario = hit_stream(hits=6, gap_us=100.0)
    for policy in POLICIES:
        sc = scenario.with_config(policy=policy, seed=3)
        runs = [run_scenario(sc, SimBackend()) for _ in range(2)]
        assert runs[0].trace_hash == runs[1].trace_hash, policy


# -- fairness: bounded-wait ----------------------------------------------------------------------


def fairness(result: RunResult) -> BoundedWait:
    assert result.scheduler is not None
    return next(c for c in result.checks if isinstance(c, BoundedWait))


def overtaken(result: RunResult, uid: int) -> list[int]:
    return fairness(result).overtakers.get(uid, [])


def run_counting(policy: str, hits: int, gap_us: float, aging: int = 4) -> RunResult:
    scenario = hit_stream(hits=hits, gap_us=gap_us).with_config(
        policy=policy, aging_tokens_per_pass=aging
    )
    result = run_scenario(scenario, SimBackend(), [*INVARIANTS, "bounded-wait=1000000"])
    assert result.ok, [v.line() for v in result.violations]
    return result


def test_bounded_wait_is_opt_in() -> None:
    assert "bounded-wait" not in [i.id for i in make_invariants(None)]
    chosen = make_invariants(["oracle", "bounded-wait=3"])
    assert [i.id for i in chosen] == ["oracle", "bounded-wait"]
    for bad in ("bounded-wait", "bounded-wait=x", "bounded-wait=-1", "oracle=1", "nope"):
        with pytest.raises(ValueError):
            make_invariants([bad])


def test_lpm_starves_a_cache_miss_for_as_long_as_hits_keep_coming() -> None:
    for hits in (10, 20):
        assert len(overtaken(run_counting("lpm", hits=hits, gap_us=100.0), VICTIM)) == hits
        assert overtaken(run_counting("fcfs", hits=hits, gap_us=100.0), VICTIM) == []


def test_lpm_aging_bounds_overtakers_by_arrival_window() -> None:
    """A later arrival outranks the victim only with a match longer by more than the aging it
    lacks: here matches differ by 48 tokens, so only hits arriving < 48 / a passes later."""
    for aging in (4, 16):
        counts = set()
        for hits in (20, 30):
            result = run_counting("lpm-aging", hits=hits, gap_us=100.0, aging=aging)
            assert max(fairness(result).passes_later[VICTIM]) < math.ceil(48 / aging)
            counts.add(len(overtaken(result, VICTIM)))
        assert len(counts) == 1  # the same count whatever the length of the stream


def test_hrrn_bound_holds_below_its_load_limit_and_breaks_above() -> None:
    assert len(overtaken(run_counting("hrrn", hits=20, gap_us=500.0), VICTIM)) <= 1
    assert len(overtaken(run_counting("hrrn", hits=20, gap_us=300.0), VICTIM)) == 20


def test_shrunk_lpm_counterexample_file() -> None:
    path = DOCS / "examples" / "lpm-bounded-wait.json"
    scenario = load_scenario_file(path)
    assert json.loads(path.read_text())["config"]["policy"] == "lpm"
    lpm = run_scenario(scenario, SimBackend(), [*INVARIANTS, "bounded-wait=1"])
    assert [v.invariant for v in lpm.violations] == ["bounded-wait"]
    for policy, bound in (("fcfs", 0), ("hrrn", 0), ("lpm-aging", 2)):
        result = run_scenario(
            scenario.with_config(policy=policy),
            SimBackend(),
            [*INVARIANTS, f"bounded-wait={bound}"],
        )
        assert result.ok, (policy, [v.line() for v in result.violations])
    # lpm-aging: both overtakers arrived in the victim's pass, inside its window of one pass.
    aging = run_scenario(
        scenario.with_config(policy="lpm-aging"), SimBackend(), [*INVARIANTS, "bounded-wait=1"]
    )
    assert [v.invariant for v in aging.violations] == ["bounded-wait"]


def test_hit_stream_example_file() -> None:
    path = DOCS / "examples" / "hit-stream-20.json"
    scenario = load_scenario_file(path)
    assert scenario == hit_stream(hits=20, gap_us=400.0).with_config(policy="lpm")
    for policy, ok in (("lpm", False), ("fcfs", True), ("hrrn", True), ("lpm-aging", True)):
        result = run_scenario(
            scenario.with_config(policy=policy), SimBackend(), [*INVARIANTS, "bounded-wait=3"]
        )
        assert result.ok is ok, policy


def test_cli_policy_and_check(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(DOCS / "examples" / "lpm-bounded-wait.json")
    assert cli_main(["run", "--scenario", path, "--check", "bounded-wait=1"]) == 1
    assert "[bounded-wait]" in capsys.readouterr().out
    fcfs = ["run", "--scenario", path, "--policy", "fcfs", "--check", "bounded-wait=0"]
    assert cli_main(fcfs) == 0
    with pytest.raises(SystemExit) as exit_:
        cli_main(["run", "--check", "bounded-wait=x"])
    assert exit_.value.code == 2


def test_the_registry_implements_exactly_the_policies_the_config_names() -> None:
    from overlapcheck.reference.policy import REGISTRY, register

    assert sorted(REGISTRY) == sorted(POLICIES)
    with pytest.raises(ValueError, match="registered twice"):
        register("fcfs", REGISTRY["fcfs"].factory)
