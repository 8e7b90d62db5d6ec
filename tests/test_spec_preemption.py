"""Speculation together with preemption: a verify step takes its pages on demand, and a
request preempted with a verify step in flight gets that step's result under the policy's rule
(kept: sent and folded into the recompute; retracted: dropped and sampled again; swapped: its
KV, rejected drafts' cells included, offloaded whole). Clean in every mode and loop; the
illegal neighbour, books reset before the in-flight step drained (vLLM #48245), fires."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference import faults as F
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import named_scenario

US = 1e-6
MODES = [(m, p) for m in ("recompute", "swap") for p in ("allocation-failure", "retract-decode")]


def run(scenario: Scenario) -> tuple[RunResult, Scheduler]:
    result = run_scenario(scenario, SimBackend())
    assert isinstance(result.scheduler, Scheduler)
    return result, result.scheduler


@pytest.mark.parametrize(("mode", "policy"), MODES)
@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_speculation_preempts_cleanly_in_every_mode(mode: str, policy: str, loop: str) -> None:
    """The speculative scenario (long accepted runs, EOS and max_tokens inside a step, a
    chunked prompt) in pools that run out: every invariant holds, and requests were preempted
    with verify steps of their own."""
    preempted = 0
    for pages in (56, 98):
        scenario = named_scenario("speculative").with_config(
            preemption=mode,
            page_alloc="on-demand",
            preempt_policy=policy,
            num_pages=pages,
            loop=loop,
        )
        result, sched = run(scenario)
        assert result.ok, result.violations[0].line()
        assert sched.spec is not None and sched.spec.stats.emitted > sched.spec.stats.steps
        preempted += sched.preemptions
    assert preempted > 0


# Shrunk by `explore --fault preempt-placeholder-reset`: request 2 (a period of two, accepted)
# is preempted while its verify step is in flight, and recomputed.
RESET = Scenario(
    "preempt-placeholder-reset",
    SchedulerConfig(
        num_slots=2,
        num_pages=18,
        max_seq_len=48,
        policy="lof",
        preemption="recompute",
        page_alloc="on-demand",
        preempt_policy="allocation-failure",
        draft_tokens=1,
    ),
    (
        RequestSpec(0, (3,) * 9, max_tokens=7),
        RequestSpec(
            2, (339, 87), max_tokens=11, arrival=12 * US, continuation=(339, 87) * 5 + (339,)
        ),
    ),
)


def test_books_reset_before_the_in_flight_step_drained_repeat_tokens() -> None:
    faulty, sched = run(RESET.with_config(faults=frozenset([F.PREEMPT_PLACEHOLDER_RESET])))
    assert sched.preemptions > 0
    assert faulty.violations[0].invariant in F.FAULTS[F.PREEMPT_PLACEHOLDER_RESET].breaks
    assert faulty.violations[0].uids == (2,)
    fixed, sched = run(RESET)
    assert fixed.ok and sched.preemptions > 0
    assert [o.tokens for o in fixed.outcomes if o.uid == 2] == [
        list(RESET.requests[1].continuation)
    ]


def test_speculation_with_preemption_is_no_longer_a_config_error() -> None:
    cfg = SchedulerConfig(draft_tokens=2, preemption="swap", page_alloc="on-demand")
    assert cfg.draft_tokens == 2


# Found by a 16-core `explore` of the shipped scheduler (seed 5), shrunk: request 0 is swapped
# out with a verify step of three drafts in flight, so its offload covers the rejected drafts'
# cells too; swapping it back in must count those pages, or the pool runs dry mid swap-in.
SWAP_IN = Scenario(
    "swap-in-counts-offloaded-drafts",
    SchedulerConfig(
        num_slots=2,
        num_pages=15,
        page_size=1,
        max_seq_len=48,
        cache="radix",
        preemption="swap",
        page_alloc="on-demand",
        preempt_policy="allocation-failure",
        draft_tokens=3,
    ),
    (
        RequestSpec(0, (3,), max_tokens=11, arrival=US, continuation=(3,) * 11),
        RequestSpec(1, (3,), max_tokens=14, arrival=US),
    ),
)


def test_a_swap_in_takes_the_pages_of_everything_its_offload_saved() -> None:
    result, sched = run(SWAP_IN)
    assert result.ok, result.violations[0].line()
    assert sched.preemptions > 0
