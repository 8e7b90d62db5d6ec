"""Workloads people actually send: follow-up turns, conversation trees (branches off shared
prefixes at any depth), reused uids, long outputs beside short ones, iteration-keyed arrivals and
aborts, a model that says EOS by itself, bigger shapes, memory pressure on a cache in use. Each is
drawn by the strategies, runs clean on the reference scheduler, and replays."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.toy_model import ToyModel
from overlapcheck.cli import main
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference.cache.radix import RadixCache, RadixNode
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict
from overlapcheck.scenarios.pressure import PRESSURE_EOS, concurrent_workloads, pressure_eos
from overlapcheck.scenarios.rows import ROW_ROOM, at_row_end
from overlapcheck.scenarios.strategies import (
    PRESSURE_EIGHTHS,
    configs,
    conversation_trees,
    generated_scenarios,
    kept,
    tight_pool,
    under_pressure,
)

US = 1e-6
# The first drawn example of a kind, unshrunk (shrinking is for failures; the first draw of all
# is the simplest one, which is what shrinking aims at).
FIND = settings(
    max_examples=2000,
    database=None,
    deadline=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def run(scenario: Scenario, **changes: object) -> RunResult:
    return run_scenario(scenario.with_config(**changes) if changes else scenario, SimBackend())


def round_trip(scenario: Scenario) -> Scenario:
    return scenario_from_dict(json.loads(json.dumps(scenario.to_json())))


def replays(scenario: Scenario) -> RunResult:
    """Clean; the file round trip gives the same scenario and the same trace; the deliveries
    (as a GPU replay uses them) give the same message stream."""
    first = run(scenario)
    assert first.ok, first.violations[0].line()
    assert round_trip(scenario) == scenario
    assert run(round_trip(scenario)).trace_hash == first.trace_hash
    again = run_scenario(scenario, SimBackend(), deliveries=first.deliveries)
    assert again.ok and again.deliveries == first.deliveries
    assert again.outcomes == first.outcomes
    return first


def shared_depth(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def branches(scenario: Scenario) -> bool:
    """A conversation tree: a turn extends an earlier request, and prompts share prefixes that
    end at two or more depths (whole shared prefixes would all end at the same one)."""
    reqs = scenario.requests
    depths = {shared_depth(a.prompt, b.prompt) for i, a in enumerate(reqs) for b in reqs[i + 1 :]}
    return len(depths - {0}) >= 2 and any(r.after is not None for r in reqs)


def pressured(scenario: Scenario) -> bool:
    """A pool drawn after its workload, as a share of what the workload needs, on a radix cache
    that several requests share."""
    cfg, reqs = scenario.config, scenario.requests
    low, high = (tight_pool(cfg, reqs, k) for k in PRESSURE_EIGHTHS)
    return (
        cfg.cache == "radix"
        and cfg.num_slots >= 2
        and len(reqs) >= 3
        and low <= cfg.num_pages <= high
    )


def resent_at_row_end(scenario: Scenario) -> bool:
    """A prompt within 4 tokens of its row's end (the row as vLLM serves it too: at most what the
    pool holds), sent again once the first was served, on a prefix cache, with a page holding
    only the prompt's last token: the second is admitted needing that one token."""
    cfg = scenario.config
    row = min(cfg.max_seq_len, cfg.num_pages * cfg.page_size)
    return cfg.cache == "radix" and any(
        r.arrival_after is not None
        and scenario.requests[r.arrival_after.request].prompt == r.prompt
        and len(r.prompt) >= row - 4
        and (len(r.prompt) - 1) % cfg.page_size == 0
        for r in scenario.requests
    )


KINDS: dict[str, Callable[[Scenario], bool]] = {
    # More requests than a plain workload holds (5): only a tree has up to 8.
    "conversation-tree": lambda s: len(s.requests) > 5 and branches(s),
    "follow-up": lambda s: any(r.after is not None for r in s.requests),
    "uid-reuse": lambda s: len({r.uid for r in s.requests}) < len(s.requests),
    "long": lambda s: any(r.max_tokens > 8 for r in s.requests),
    "arrival-iteration": lambda s: any(r.arrival_iteration is not None for r in s.requests),
    "abort-iteration": lambda s: any(r.abort_iteration is not None for r in s.requests),
    "model-eos": lambda s: s.eos_probability > 0,
    # A model EOS only a workload under concurrent pressure draws (`pressure_eos`): a preemption
    # meets a request at a token that ends it.
    "pressure-eos": lambda s: s.eos_probability in set(PRESSURE_EOS) - {0.0, 0.1},
    "big-shape": lambda s: s.config.num_slots > 4 and s.config.max_seq_len == 256,
    "memory-pressure": pressured,
    "resent-at-row-end": resent_at_row_end,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_is_drawn_and_runs_clean_and_replays(kind: str) -> None:
    drawn = find(generated_scenarios(), KINDS[kind], settings=FIND)
    replays(drawn)


def test_the_smallest_draw_is_the_quiet_case() -> None:
    quiet = find(generated_scenarios(), lambda s: True, settings=FIND)
    (spec,) = quiet.requests
    assert spec == RequestSpec(0, spec.prompt, max_tokens=1)
    assert quiet.eos_probability == 0 and quiet.config.max_seq_len == 48
    assert quiet.config.num_slots == 1


def test_requests_at_the_row_end_shrink_to_the_workload_as_drawn() -> None:
    config = SchedulerConfig(page_size=2, num_pages=8, max_seq_len=48, cache="naive")
    reqs = (
        RequestSpec(0, (5, 6, 7), max_tokens=3),
        RequestSpec(1, (8, 9), max_tokens=8),
        RequestSpec(2, (10,), max_tokens=2, after=1),  # a follow-up: it and its turn stay
    )
    shrink = settings(FIND, phases=[Phase.generate, Phase.shrink])
    assert find(at_row_end(config, reqs), lambda _: True, settings=shrink) == (config, reqs)
    cfg, out = find(at_row_end(config, reqs), lambda drawn: len(drawn[1]) > 3, settings=shrink)
    first, resent = out[0], out[3]  # the one request that may stretch, and it sent again
    assert out[1:3] == reqs[1:]
    assert 48 - ROW_ROOM <= len(first.prompt) < 48 and len(first.prompt) + first.max_tokens <= 48
    assert first.prompt[:3] == (5, 6, 7) and first.max_tokens == 1
    assert resent.prompt == first.prompt and resent.arrival_after is not None
    assert resent.arrival_after.request == 0 and resent.uid not in (0, 1, 2)
    assert cfg == replace(config, cache="radix", num_pages=24)  # what the stretched one needs


def test_pressure_eos_and_ignore_eos_shrink_to_the_quiet_case() -> None:
    """Under concurrent pressure a model EOS is drawn (and shrinks to none), and requests
    ignore EOS only now and then (shrinking to none that does)."""
    assert find(pressure_eos(), lambda p: True, settings=FIND) == 0.0
    reqs = find(concurrent_workloads(SchedulerConfig(num_slots=2)), lambda r: True, settings=FIND)
    assert not any(r.ignore_eos for r in reqs)


def test_conversation_trees_split_prefixes_that_live_requests_hold_locked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the trees: a radix node that a live request holds locked is split by a
    request matching only part of it (the mutant `split-drops-lock` needs exactly this)."""
    splits: list[bool] = []  # per split: was the node locked
    original = RadixCache._split

    def split(self: RadixCache, node: RadixNode, at: int) -> RadixNode:
        splits.append(node.lock_ref > 0)
        return original(self, node, at)

    monkeypatch.setattr(RadixCache, "_split", split)

    def splits_a_locked_node(scenario: Scenario) -> bool:
        splits.clear()
        run(scenario)
        return any(splits)

    trees = st.builds(
        lambda config, reqs: Scenario("tree", config, reqs),
        configs(),
        conversation_trees(),
    )
    drawn = find(trees, splits_a_locked_node, settings=FIND)
    assert drawn.config.cache == "radix" and len(drawn.requests) >= 2
    replays(drawn)


def test_memory_pressure_evicts_past_a_prefix_that_a_live_request_holds_locked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of a pool drawn after its workload: eviction reaches the situation where the
    least recently used leaf is one a live request holds locked (its match touched it, and
    requests that finished since left newer leaves), so only the lock keeps its pages from
    being freed under the request (the mutant `evict-locked-node` needs exactly this)."""
    protected: list[bool] = []  # per eviction: was the LRU leaf locked

    original = RadixCache.evict

    def evict(self: RadixCache, num_pages: int) -> list[int]:
        leaves = [n for n in self._nodes() if n is not self.root and not n.children]
        if leaves:
            protected.append(min(leaves, key=lambda n: (n.last_access, n.node_id)).lock_ref > 0)
        return original(self, num_pages)

    monkeypatch.setattr(RadixCache, "evict", evict)

    def evicts_around_a_locked_lru_leaf(scenario: Scenario) -> bool:
        protected.clear()
        run(scenario)
        return any(protected)

    pressure = configs().flatmap(under_pressure).map(lambda drawn: Scenario("pressure", *drawn))
    drawn = find(pressure, evicts_around_a_locked_lru_leaf, settings=FIND)
    assert pressured(drawn)
    replays(drawn)


def chat() -> Scenario:
    return Scenario(
        "chat",
        SchedulerConfig(num_slots=2, num_pages=64, max_seq_len=64),
        (
            RequestSpec(1, (5, 6, 7), max_tokens=4),
            RequestSpec(1, (9, 10), max_tokens=3, after=0, think=50 * US),  # same uid, new turn
            RequestSpec(2, (11,), max_tokens=3, after=1),  # a third turn under another uid
            RequestSpec(3, (8, 8, 8), max_tokens=30, abort_at=300 * US),
            RequestSpec(4, (12,), max_tokens=2, after=3, think=10 * US),  # follows an aborted one
        ),
    )


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_a_follow_up_is_built_from_what_the_scheduler_sent_and_judged_right(loop: str) -> None:
    scenario = chat().with_config(loop=loop)
    result = replays(scenario)
    reqs = result.requests
    first, second = (r for r in reqs if r.uid == 1)
    third = next(r for r in reqs if r.uid == 2)
    assert second.msg.input_ids == (5, 6, 7, *first.tokens, 9, 10)
    assert third.msg.input_ids == (*second.msg.input_ids, *second.tokens, 11)
    model = ToyModel(1024, 2)
    for req in (second, third):  # the oracle's reference is the follow-up's own prompt
        assert req.tokens == model.generate(req.msg.input_ids, req.max_output, False)
    aborted = next(r for r in reqs if r.uid == 3)
    follow = next(r for r in reqs if r.uid == 4)
    assert aborted.aborted_step is not None and 0 < len(aborted.tokens) < 30
    assert follow.msg.input_ids == (8, 8, 8, *aborted.tokens, 12)  # sent with what it got


def test_a_reused_uid_is_served_after_its_request_ended_and_rejected_while_live() -> None:
    scenario = Scenario(
        "reuse",
        SchedulerConfig(num_slots=2, num_pages=64),
        (
            RequestSpec(7, (5, 6), max_tokens=3),
            RequestSpec(7, (5, 9), max_tokens=2),  # at once: uid 7 is live -> rejected
            RequestSpec(7, (4, 4, 4), max_tokens=2, arrival=2000 * US),  # long after: served
        ),
    )
    for loop in ("overlap", "normal"):
        result = replays(scenario.with_config(loop=loop))
        assert [o.finish_reason for o in result.outcomes] == ["rejected", "length", "length"] or [
            o.finish_reason for o in result.outcomes
        ] == ["length", "rejected", "length"]
        assert [len(o.tokens) for o in result.outcomes if o.finish_reason == "length"] == [3, 2]


def test_iteration_fields_deliver_at_the_same_iterations_in_both_loops() -> None:
    scenario = Scenario(
        "by-iteration",
        SchedulerConfig(num_slots=2, num_pages=64),
        (
            RequestSpec(0, (5, 6, 7, 8, 9), max_tokens=12, abort_iteration=4),
            RequestSpec(1, (3, 4), max_tokens=3, arrival_iteration=2),
            RequestSpec(2, (7,), max_tokens=2, arrival_iteration=9, abort_iteration=10),
        ),
    )
    seen = []
    for loop in ("overlap", "normal"):
        result = replays(scenario.with_config(loop=loop))
        seen.append(result.deliveries)
    assert seen[0] == seen[1] == [(0, 0, "user"), (2, 1, "user"), (4, 0, "abort"),
                                  (9, 2, "user"), (10, 2, "abort")]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"arrival": 0.001, "arrival_iteration": 2}, "not both"),
        ({"abort_at": 0.001, "abort_iteration": 2}, "not both"),
        ({"after": 0}, "earlier request"),
        ({"think": 0.1}, "needs 'after'"),
        ({"abort_iteration": -1}, ">= 0"),
    ],
)
def test_bad_combinations_are_one_line_errors(
    fields: dict[str, object], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {"requests": [{"uid": 0, "prompt": [5], **fields}]}
    with pytest.raises(ScenarioError, match=says):
        scenario_from_dict(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["run", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_a_follow_up_cannot_arrive_by_itself() -> None:
    data = {"requests": [{"uid": 0, "prompt": [5]}, {"uid": 1, "prompt": [6], "after": 0,
                                                     "arrival_iteration": 3}]}  # fmt: skip
    with pytest.raises(ScenarioError, match=r"requests\[1\].*no arrival fields"):
        scenario_from_dict(data)


def test_eos_probability_ends_requests_at_eos_without_a_script() -> None:
    reqs = tuple(RequestSpec(uid, (5, uid + 10), max_tokens=40) for uid in range(6))
    base = Scenario("eos", SchedulerConfig(num_slots=4, num_pages=512), reqs)
    quiet = run(base)
    assert {o.finish_reason for o in quiet.outcomes} == {"length"}
    talky = replace_eos(base, 0.2)
    result = replays(talky)
    reasons = [o.finish_reason for o in result.outcomes]
    assert reasons.count("eos") >= 3
    model = ToyModel(1024, 2, eos_probability=0.2)
    for spec, outcome in zip(reqs, result.outcomes, strict=True):  # the reference agrees
        assert outcome.tokens == model.generate(spec.prompt, 40, False)
        assert outcome.tokens[-1] == 2 or len(outcome.tokens) == 40


def replace_eos(scenario: Scenario, p: float) -> Scenario:
    return Scenario(scenario.name, scenario.config, scenario.requests, eos_probability=p)


def test_a_long_request_beside_short_ones_under_eviction_pressure() -> None:
    system = tuple(range(10, 26))
    reqs = (
        RequestSpec(0, system + (3,), max_tokens=48 - 17),  # all the row holds
        *(RequestSpec(i, system + (i + 3,), max_tokens=2, arrival=i * 40 * US) for i in (1, 2)),
        RequestSpec(3, (7, 7, 7, 7, 7, 7), max_tokens=2, arrival=200 * US),
    )
    scenario = Scenario("long", SchedulerConfig(num_slots=3, num_pages=56, max_seq_len=48), reqs)
    for loop in ("overlap", "normal"):
        result = replays(scenario.with_config(loop=loop))
        assert len(result.outcomes[0].tokens) == 31


@pytest.mark.slow
def test_the_fixed_scheduler_is_clean_over_20000_generated_examples() -> None:
    from overlapcheck.bench.fixed_clean import run as clean_run

    result = clean_run(20_000)
    assert result.examples == 20_000
    assert not result.violations, result.violations[:5]


def test_a_uid_reused_right_after_its_finished_message_is_served_in_the_overlap_loop() -> None:
    scenario = Scenario(
        "reuse-at-once",
        SchedulerConfig(num_slots=2, num_pages=64),
        (
            RequestSpec(1, (5, 6, 7), max_tokens=8, continuation=(41, 2)),
            RequestSpec(1, (9,), max_tokens=2, after=0),  # the next turn, no think time
        ),
    )
    assert run(scenario.with_config(loop="normal")).ok
    result = run(scenario)
    assert result.ok, result.violations[0].line()


def test_a_variation_drops_requests_and_renumbers_follow_ups() -> None:
    """How a named variation shrinks to what its failure needs: a dropped request's follow-ups go
    with it, the others point at the same requests as before; nothing kept leaves the first."""
    reqs = chat().requests  # 1 follows 0, 2 follows 1, 4 follows 3
    assert kept(reqs, [True, False, True, True, True]) == (
        reqs[0],
        reqs[3],
        replace(reqs[4], after=1),
    )
    assert kept(reqs, [False, True, False, True, False]) == (reqs[3],)
    assert kept(reqs, [False] * 5) == (reqs[0],)
    assert kept(reqs, [True] * 5) == reqs
