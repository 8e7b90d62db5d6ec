"""Our queue policies beside SGLang's own (`SchedulePolicy.calc_priority` of SGLang 0.5.23, from
`../shared/upstream/sglang-0.5.23-src.tar.gz` or `SGLANG_SNAPSHOT`, unpacked at test time): the
same waiting queues and radix trees, generated with shared prefixes, must come out in the same
order under `lpm`, `dfs-weight`, `fcfs` and `lof`, with SGLang's in-batch prefix check and its
`lpm` fallback; `random` is compared by its distribution. What differs on purpose is listed in
docs/policies.md. SGLang is imported once per test process.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from itertools import permutations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_snapshot import shared_tree, skip_unless_usable

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import SamplingParams
from overlapcheck.reference.cache.radix import RadixCache
from overlapcheck.reference.policy import make_policy
from overlapcheck.reference.req import Req

skip_unless_usable()

from overlapcheck.adapters.base import Loaded  # noqa: E402
from overlapcheck.adapters.sglang.policy import PolicyCase, sglang_order  # noqa: E402


@pytest.fixture(scope="module")
def sglang() -> Loaded:
    from overlapcheck.adapters.sglang.upstream import ENV, load_sglang

    saved = os.environ.get(ENV)
    os.environ[ENV] = str(shared_tree())
    try:
        return load_sglang()
    finally:
        if saved is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = saved


def our_order(case: PolicyCase) -> list[int]:
    config = SchedulerConfig(
        policy=case.policy,  # type: ignore[arg-type]
        page_size=case.page_size,
        in_batch_check_threshold=case.check_threshold,
        in_batch_deprioritize_threshold=case.deprioritize_threshold,
        lpm_fallback_queue_len=case.fallback_len,
    )
    tree = RadixCache(case.page_size)
    cell = 0
    for tokens in case.cached:
        tree.insert(tokens, list(range(cell, cell + len(tokens))))
        cell += len(tokens)
    queue = [
        Req(uid, prompt, SamplingParams(max_tokens=m), m, 0)
        for uid, (prompt, m) in enumerate(zip(case.prompts, case.max_tokens, strict=True))
    ]
    return [r.uid for r in make_policy(config, tree).order(queue, 0)]


TOKEN = st.integers(1, 3)  # few tokens: prompts share prefixes often


@st.composite
def cases(draw: st.DrawFn) -> PolicyCase:
    """A tree of 0-4 cached sequences and a queue of 1-7 prompts that extend cached sequences,
    earlier prompts or nothing, with thresholds small enough for the in-batch check to act."""
    seqs = st.lists(TOKEN, min_size=1, max_size=6).map(tuple)
    cached = draw(st.lists(seqs, max_size=4))
    prompts: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, 7))):
        pool = [*cached, *prompts]
        base = draw(st.sampled_from(pool)) if pool and draw(st.booleans()) else ()
        cut = draw(st.integers(0, len(base)))
        prompts.append(base[:cut] + draw(st.lists(TOKEN, min_size=1, max_size=4).map(tuple)))
    return PolicyCase(
        policy=draw(st.sampled_from(("lpm", "dfs-weight", "fcfs", "lof"))),
        page_size=draw(st.sampled_from((1, 1, 2))),
        cached=tuple(cached),
        prompts=tuple(prompts),
        max_tokens=tuple(draw(st.integers(1, 3)) for _ in prompts),
        check_threshold=draw(st.sampled_from((-1, 0, 1, 2, 4, 32))),
        deprioritize_threshold=draw(st.sampled_from((1, 2, 3, 32))),
        fallback_len=draw(st.sampled_from((3, 128))),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_orders_agree_with_sglang(sglang: Loaded, case: PolicyCase) -> None:
    assert our_order(case) == sglang_order(sglang, case), case


def test_a_disagreement_would_be_seen(sglang: Loaded) -> None:
    """The comparison can fail: SGLang's `dfs-weight` breaks ties between sibling subtrees by
    the tree's order, which is not arrival order."""
    case = PolicyCase("dfs-weight", 1, ((1, 1), (2, 2)), ((2, 2, 3), (1, 1, 3)), (1, 1))
    assert sglang_order(sglang, case) == our_order(case) == [1, 0]
    case = PolicyCase("lpm", 1, ((1, 1, 1),), ((2, 3), (1, 1, 1, 1)), (1, 1))
    assert sglang_order(sglang, case) == our_order(case) == [1, 0]


def test_random_has_the_same_distribution(sglang: Loaded) -> None:
    """Both shuffle uniformly: each of the 6 orders of a 3-request queue about 1/6 of the time
    (a chi-square test at the 0.1 % level, 5 degrees of freedom, on fixed seeds)."""
    n = 1200
    case = PolicyCase("random", 1, (), ((1,), (2,), (3,)), (1, 1, 1))
    state = random.getstate()
    try:
        random.seed(7)  # SGLang shuffles with the global generator
        theirs = Counter(tuple(sglang_order(sglang, case)) for _ in range(n))
    finally:
        random.setstate(state)
    config = SchedulerConfig(policy="random", seed=7)
    policy = make_policy(config, RadixCache(1))
    queue = [Req(u, (u + 1,), SamplingParams(max_tokens=1), 1, 0) for u in range(3)]
    ours = Counter(tuple(r.uid for r in policy.order(queue, 0)) for _ in range(n))
    for counts in (theirs, ours):
        assert set(counts) == set(permutations(range(3)))
        chi2 = sum((counts[p] - n / 6) ** 2 / (n / 6) for p in permutations(range(3)))
        assert chi2 < 20.52, counts
