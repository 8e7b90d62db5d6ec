"""The named scenario `speculative`, and the repetitive prompts that make drafts accepted.

The toy model follows a scripted continuation where a scenario gives one; a repetitive prompt
whose continuation keeps repeating it is what a real model does with repetitive text, so prompt
lookup drafts get accepted in long runs there and hardly ever elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import strategies as st

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.scenarios.draws import EOS, US


def periodic(period: tuple[int, ...], length: int, offset: int = 0) -> tuple[int, ...]:
    """`length` tokens of `period` repeated, starting `offset` into it."""
    return tuple(period[(offset + i) % len(period)] for i in range(length))


def repetitive(
    rng: random.Random, period: int, prompt_len: int, max_tokens: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A prompt that repeats a random period, and the continuation that keeps repeating it."""
    cycle = tuple(rng.randrange(3, 1000) for _ in range(period))
    return periodic(cycle, prompt_len), periodic(cycle, max_tokens, offset=prompt_len)


def speculative() -> Scenario:
    rng = random.Random(9)
    p0, c0 = repetitive(rng, 5, 20, 24)
    p2, c2 = repetitive(rng, 3, 9, 6)
    p3, c3 = repetitive(rng, 4, 40, 9)
    reqs = (
        RequestSpec(0, p0, max_tokens=24, continuation=c0),  # drafts accepted in long runs
        RequestSpec(1, tuple(rng.randrange(3, 1000) for _ in range(12)), max_tokens=10),
        RequestSpec(2, p2, max_tokens=16, continuation=c2 + (EOS,)),  # EOS inside a step
        # chunked, arriving while the others decode (they sit out its prefill); max_tokens cuts
        # a multi-token step
        RequestSpec(3, p3, max_tokens=9, continuation=c3, arrival=150 * US),
        RequestSpec(
            4, tuple(rng.randrange(3, 1000) for _ in range(7)), max_tokens=6, arrival=300 * US
        ),
    )
    return Scenario(
        "speculative",
        SchedulerConfig(num_slots=4, num_pages=256, max_extend_tokens=16, draft_tokens=4),
        reqs,
        "speculative decoding, 4 drafts a step by prompt lookup: repetitive prompts accept long "
        "runs, others hardly any; EOS and max_tokens inside a step, a chunked prompt arriving "
        "while the others decode",
    )


@st.composite
def speculating(
    draw: st.DrawFn, config: SchedulerConfig, reqs: tuple[RequestSpec, ...]
) -> tuple[SchedulerConfig, tuple[RequestSpec, ...]]:
    """Speculation on a drawn workload: up to 4 drafts a step, and some prompts made repetitive
    (a period of their own first tokens, the scripted continuation repeating it, a scripted EOS
    kept where it was), so acceptance runs from none to whole steps. Lengths stay as drawn, so
    the workload stays valid for the config. Shrinks toward one draft, nothing repetitive."""
    config = replace(config, draft_tokens=draw(st.integers(1, 4)))  # preemption as drawn
    out = []
    for spec in reqs:
        if spec.after is not None or not draw(st.booleans()):
            out.append(spec)
            continue
        cycle = spec.prompt[: draw(st.integers(1, 6))]
        prompt = periodic(cycle, len(spec.prompt))
        ends = bool(spec.continuation) and spec.continuation[-1] == EOS
        length = len(spec.continuation) - 1 if ends else spec.max_tokens
        continuation = periodic(cycle, length, offset=len(prompt)) + ((EOS,) if ends else ())
        out.append(replace(spec, prompt=prompt, continuation=continuation))
    return config, tuple(out)
