"""Workloads for the queue-policy benchmark: who shares which prefix, and when requests arrive.

All three are built from fixed seeds, share one configuration (8 slots, 2048 KV pages of one token,
a prefill budget of 256 tokens per batch) and arrive at a rate near what the scheduler can serve
when it reuses the cache, so a queue forms and the policy has a choice to make. The pages hold the
running requests and only some of the shared prefixes: which prefixes stay cached depends on the
order requests are served in. Times are simulated seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from overlapcheck.backends.sim.toy_model import ToyModel
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario

US = 1e-6
SLOTS = 8
MAX_SEQ = 512


def _config() -> SchedulerConfig:
    return SchedulerConfig(
        num_slots=SLOTS, num_pages=2048, max_extend_tokens=256, max_seq_len=MAX_SEQ
    )


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, 1000) for _ in range(n))


def _arrivals(rng: random.Random, n: int, mean_gap_us: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(round(t, 1) * US)
        t += rng.expovariate(1 / mean_gap_us)
    return out


def system_prompts(users: int = 128, prompts: int = 8, seed: int = 1) -> Scenario:
    """A few long system prompts, each shared by many users with their own short question."""
    rng = random.Random(seed)
    systems = [_tokens(rng, 256) for _ in range(prompts)]
    times = _arrivals(rng, users, 500.0)
    reqs = tuple(
        RequestSpec(
            uid,
            systems[rng.randrange(prompts)] + _tokens(rng, rng.randrange(8, 48)),
            max_tokens=rng.randrange(4, 24),
            arrival=times[uid],
            ignore_eos=True,
        )
        for uid in range(users)
    )
    return Scenario(
        "system-prompts",
        _config(),
        reqs,
        f"{users} users over {prompts} system prompts of 256 tokens",
    )


def chat_tree(
    conversations: int = 16, turns: int = 4, branches: int = 2, seed: int = 2
) -> Scenario:
    """Multi-turn chats under one system prompt. Each turn's prompt is the previous prompt, the
    model's answer to it and a new user message; at turn 2 each chat forks into `branches`
    (regenerated or edited follow-ups), so the prefixes form a tree."""
    rng = random.Random(seed)
    cfg = _config()
    model = ToyModel(cfg.vocab_size, cfg.eos_token_id, cfg.seed)
    system = _tokens(rng, 96)
    reqs: list[RequestSpec] = []
    for c in range(conversations):
        start = c * 600.0 + rng.uniform(0, 300)
        frontier = [system + _tokens(rng, rng.randrange(16, 48))]
        for turn in range(turns):
            max_tokens = rng.randrange(8, 24)
            nxt = []
            for prompt in frontier:
                t = start + turn * 4000.0 + rng.uniform(0, 1000)
                reqs.append(
                    RequestSpec(
                        len(reqs), prompt, max_tokens=max_tokens, arrival=t * US, ignore_eos=True
                    )
                )
                answer = tuple(model.generate(prompt, max_tokens, ignore_eos=True))
                forks = branches if turn == 1 else 1
                nxt += [prompt + answer + _tokens(rng, rng.randrange(8, 32)) for _ in range(forks)]
            frontier = [p for p in nxt if len(p) + 24 <= MAX_SEQ]
    reqs.sort(key=lambda r: r.arrival)
    return Scenario(
        "chat-tree", cfg, tuple(reqs), f"{conversations} chats x {turns} turns, forking at turn 2"
    )


def no_sharing(users: int = 128, seed: int = 3) -> Scenario:
    """The control: unique prompts of the same lengths as `system_prompts`; nothing to reuse."""
    rng = random.Random(seed)
    times = _arrivals(rng, users, 500.0)
    reqs = tuple(
        RequestSpec(
            uid,
            _tokens(rng, 256 + rng.randrange(8, 48)),
            max_tokens=rng.randrange(4, 24),
            arrival=times[uid],
            ignore_eos=True,
        )
        for uid in range(users)
    )
    return Scenario("no-sharing", _config(), reqs, f"{users} unique prompts (control)")


WORKLOADS: dict[str, Callable[[], Scenario]] = {
    "system-prompts": system_prompts,
    "chat-tree": chat_tree,
    "no-sharing": no_sharing,
}
