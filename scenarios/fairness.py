"""Workloads that make queue policies show their fairness: a cache miss among a stream of hits.

`hit_stream`: a warm-up request puts a system prompt into the cache; then one request with a
prompt the cache has never seen (the victim) arrives, followed by a stream of requests that
start with the cached system prompt. `lpm` ranks every hit above the victim, so while hits keep
coming the victim waits; `fcfs` admits it next; `lpm-aging` lets it in after a bounded number of
hits, and `hrrn` does so only while the hits do not outpace the slot (docs/policies-section.md).
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import strategies as st

from overlapcheck.core.config import PolicyKind, SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario

US = 1e-6
WARM, VICTIM = 0, 1


def hit_stream(
    hits: int = 20,
    gap_us: float = 400.0,
    system_len: int = 48,
    suffix_len: int = 16,
    victim_len: int = 48,
    max_tokens: int = 4,
    num_slots: int = 1,
) -> Scenario:
    """`hits` requests of system prompt + `suffix_len` fresh tokens, one every `gap_us`, after a
    victim of `victim_len` uncached tokens; one slot, so every admission is a choice."""
    rng = random.Random(11)

    def fresh(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, 1000) for _ in range(n))

    system = fresh(system_len)
    reqs = [
        RequestSpec(WARM, system + fresh(suffix_len), max_tokens=1, ignore_eos=True),
        RequestSpec(
            VICTIM, fresh(victim_len), max_tokens=max_tokens, arrival=10 * US, ignore_eos=True
        ),
    ]
    reqs += [
        RequestSpec(
            VICTIM + 1 + i,
            system + fresh(suffix_len),
            max_tokens=max_tokens,
            arrival=(20 + i * gap_us) * US,
            ignore_eos=True,
        )
        for i in range(hits)
    ]
    longest = max(len(r.prompt) for r in reqs) + max_tokens
    config = SchedulerConfig(
        num_slots=num_slots,
        num_pages=4 * longest * num_slots + 256,
        max_seq_len=longest,
        max_extend_tokens=64,
    )
    return Scenario(
        f"hit-stream-{hits}",
        config,
        tuple(reqs),
        f"a cache miss (uid {VICTIM}) followed by {hits} cache hits every {gap_us:g} µs",
    )


@st.composite
def queued_scenarios(draw: st.DrawFn, policy: PolicyKind) -> Scenario:
    """A `hit_stream` plus a few requests of any kind (sharing some of the hits' prompt or not,
    some aborted), under drawn pool sizes, loops, caches and policy thresholds. Queues form and a
    cache holds something, so the policy has choices to make (generic workloads seldom give it
    one). Shrinks toward one hit and no extra requests."""
    base = hit_stream(
        hits=draw(st.integers(1, 6)),
        gap_us=draw(st.sampled_from((20.0, 100.0, 400.0))),
        system_len=draw(st.sampled_from((8, 40))),
        suffix_len=draw(st.integers(1, 8)),
        victim_len=draw(st.integers(1, 40)),
        max_tokens=draw(st.integers(1, 4)),
    )
    hit = base.requests[-1].prompt
    extra = tuple(
        RequestSpec(
            100 + k,
            hit[: draw(st.integers(0, len(hit)))]
            + tuple(draw(st.lists(st.integers(3, 999), min_size=1, max_size=8))),
            max_tokens=draw(st.integers(1, 6)),
            arrival=draw(st.integers(0, 20)) * 50 * US,
            abort_at=draw(st.none() | st.integers(0, 1500).map(lambda t: t * US)),
        )
        for k in range(draw(st.integers(0, 4)))
    )
    page_size = draw(st.sampled_from((1, 2, 4)))
    return replace(base, requests=base.requests + extra).with_config(
        policy=policy,
        num_slots=draw(st.integers(1, 3)),
        page_size=page_size,
        num_pages=base.config.num_pages // page_size + 64,
        max_seq_len=128,
        max_extend_tokens=draw(st.sampled_from((64, 16, 4))),
        cache=draw(st.sampled_from(("radix", "naive"))),
        loop=draw(st.sampled_from(("overlap", "normal"))),
        seed=draw(st.integers(0, 3)),
        lpm_fallback_queue_len=draw(st.sampled_from((128, 3))),
        in_batch_check_threshold=draw(st.sampled_from((32, 4))),
        in_batch_deprioritize_threshold=draw(st.sampled_from((32, 4))),
        aging_tokens_per_pass=draw(st.sampled_from((4, 0, 1))),
    )
