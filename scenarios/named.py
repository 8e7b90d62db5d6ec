"""The named scenarios: fixed workloads that each exercise one part of the scheduler.

They run as fixed seeds in the tests and seed the Hypothesis search. Prompt ids are small numbers
well inside any vocabulary; EOS is id 2 (the config default) and only scripted continuations
emit it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.scenarios.speculative import speculative

US = 1e-6
EOS = 2


def _prompt(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, 1000) for _ in range(n))


def basic() -> Scenario:
    rng = random.Random(1)
    reqs = tuple(
        RequestSpec(uid, _prompt(rng, n), max_tokens=m, arrival=t * US)
        for uid, (n, m, t) in enumerate([(5, 6, 0), (12, 3, 0), (3, 9, 150), (20, 5, 400)])
    )
    return Scenario(
        "basic",
        SchedulerConfig(num_slots=4, num_pages=128),
        reqs,
        "four requests of mixed lengths, two arriving later",
    )


def shared_prefix() -> Scenario:
    rng = random.Random(2)
    system = _prompt(rng, 24)
    reqs = tuple(
        RequestSpec(
            uid, system + _prompt(rng, 3 + uid % 4), max_tokens=4 + uid % 3, arrival=uid * 120 * US
        )
        for uid in range(6)
    )
    return Scenario(
        "shared-prefix",
        SchedulerConfig(num_slots=4, num_pages=192),
        reqs,
        "a chat system prompt shared by six users; the radix cache reuses it",
    )


def early_eos() -> Scenario:
    rng = random.Random(3)
    reqs = tuple(
        RequestSpec(
            uid,
            _prompt(rng, 6 + uid),
            max_tokens=8,
            continuation=tuple(rng.randrange(3, 1000) for _ in range(k)) + (EOS,),
        )
        for uid, k in enumerate([0, 1, 3, 5])
    )
    return Scenario(
        "early-eos",
        SchedulerConfig(num_slots=4, num_pages=128),
        reqs,
        "scripted EOS after 1, 2, 4 and 6 tokens, so rounds in flight are wasted",
    )


def abort() -> Scenario:
    rng = random.Random(4)
    reqs = (
        RequestSpec(0, _prompt(rng, 8), max_tokens=12, abort_at=500 * US),  # running
        RequestSpec(1, _prompt(rng, 40), max_tokens=4, abort_at=120 * US),  # mid-chunk
        RequestSpec(2, _prompt(rng, 6), max_tokens=4, arrival=50 * US, abort_at=60 * US),  # pending
        RequestSpec(3, _prompt(rng, 5), max_tokens=6),
        RequestSpec(4, _prompt(rng, 7), max_tokens=3, abort_at=5000 * US),  # after it finished
        RequestSpec(5, _prompt(rng, 4), max_tokens=5, arrival=300 * US),
    )
    return Scenario(
        "abort",
        SchedulerConfig(num_slots=4, num_pages=128, max_extend_tokens=16),
        reqs,
        "aborts while pending, mid-chunk, running, and after finishing",
    )


def chunked_long() -> Scenario:
    rng = random.Random(5)
    reqs = tuple(
        RequestSpec(uid, _prompt(rng, n), max_tokens=4, arrival=uid * 80 * US)
        for uid, n in enumerate([100, 37, 64])
    )
    return Scenario(
        "chunked-long",
        SchedulerConfig(num_slots=4, num_pages=256, max_extend_tokens=16),
        reqs,
        "long prompts prefilled in chunks of 16 tokens",
    )


def memory_pressure() -> Scenario:
    rng = random.Random(6)
    prefixes = [_prompt(rng, 12), _prompt(rng, 12)]
    reqs = tuple(
        RequestSpec(uid, prefixes[uid % 2] + _prompt(rng, 4), max_tokens=6, arrival=uid * 60 * US)
        for uid in range(8)
    )
    return Scenario(
        "memory-pressure",
        SchedulerConfig(num_slots=4, num_pages=48),
        reqs,
        "48 pages for 8 requests of 22 tokens: requests wait, cached prefixes are evicted",
    )


def preemption() -> Scenario:
    rng = random.Random(10)
    reqs = tuple(
        RequestSpec(uid, _prompt(rng, 10 + uid % 3), max_tokens=14, arrival=uid * 20 * US)
        for uid in range(6)
    )
    return Scenario(
        "preemption",
        SchedulerConfig(num_slots=4, num_pages=40, max_extend_tokens=16),
        reqs,
        "40 pages for running requests that grow to 24-26 tokens each: any on-demand scheduler "
        "that runs two at once must preempt; recomputes are chunked",
    )


def single_slot() -> Scenario:
    rng = random.Random(7)
    reqs = tuple(RequestSpec(uid, _prompt(rng, 4 + uid), max_tokens=3) for uid in range(4))
    return Scenario(
        "single-slot",
        SchedulerConfig(num_slots=1, num_pages=64),
        reqs,
        "one request slot: every request reuses the slot of the one before",
    )


def page_size_4() -> Scenario:
    rng = random.Random(8)
    system = _prompt(rng, 10)
    reqs = tuple(
        RequestSpec(uid, system + _prompt(rng, 2 + uid), max_tokens=5, arrival=uid * 100 * US)
        for uid in range(5)
    )
    return Scenario(
        "page-size-4",
        SchedulerConfig(num_slots=4, num_pages=64, page_size=4),
        reqs,
        "pages of 4 tokens: partial pages, page-aligned prefix matches",
    )


NAMED: dict[str, Callable[[], Scenario]] = {
    "basic": basic,
    "shared-prefix": shared_prefix,
    "early-eos": early_eos,
    "abort": abort,
    "chunked-long": chunked_long,
    "memory-pressure": memory_pressure,
    "preemption": preemption,
    "single-slot": single_slot,
    "page-size-4": page_size_4,
    "speculative": speculative,
}


def named_scenario(name: str) -> Scenario:
    if name not in NAMED:
        raise KeyError(name)
    return NAMED[name]()
