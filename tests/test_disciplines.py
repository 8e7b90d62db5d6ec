"""Legal scheduling disciplines stay clean, and the illegal neighbour of each is caught.

The scheduler is `examples/ondemand_scheduler.py` (vLLM-v1-style: pages on demand, preemption by
recompute, one mixed batch per iteration), written against `core/` only:
* a chunked re-prefill after preemption, and a position sampled again after a retracted request's
  in-flight result was dropped (SGLang), are not extra output work (`work-bound` judges positions
  sampled, not forwards); a scheduler that sends the dropped result too, or decodes past
  `max_tokens` after a recompute, is caught;
* a slot reused before the host waited for the round still in flight is clean when every copy
  queues behind that round on the engine stream (vLLM's single stream), and caught when the
  copies run on the scheduler stream unordered with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import (
    MessageSink,
    MessageSource,
    SchedulerFactory,
    SchedulerUnderTest,
)
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.forwards import context_ends
from overlapcheck.scenarios.named import NAMED, named_scenario

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ondemand_scheduler.py"
LEGAL = ["make_scheduler", "make_discard_scheduler", "make_stream_ordered_scheduler"]
LEGAL += ["make_stream_ordered_discard_scheduler"]


class Counted:
    """A factory that keeps the scheduler it built, to read its counters after the run."""

    def __init__(self, name: str) -> None:
        self.factory: SchedulerFactory = SchedulerSpec(f"{EXAMPLE}:{name}").factory()
        self.built: SchedulerUnderTest | None = None

    def __call__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> SchedulerUnderTest:
        self.built = self.factory(config, device, source, sink)
        return self.built

    def count(self, name: str) -> int:
        value = getattr(self.built, name)
        assert isinstance(value, int)
        return value


def run(
    name: str, scenario: Scenario, checks: list[str] | None = None
) -> tuple[RunResult, Counted]:
    made = Counted(name)
    return run_scenario(scenario, SimBackend(), checks, scheduler=made), made


def first(result: RunResult) -> str:
    return result.violations[0].invariant if result.violations else "ok"


# One slot. Request 1 stops at EOS on its second token while its third round is in flight;
# request 2 arrives then and gets the slot at once.
REUSE = Scenario(
    "reuse",
    SchedulerConfig(num_slots=1, num_pages=32, max_seq_len=32),
    (
        RequestSpec(1, (5, 6, 7, 8), max_tokens=4, continuation=(41, 2)),
        RequestSpec(2, (10, 11, 12), max_tokens=3, continuation=(51, 52, 53), arrival_iteration=2),
    ),
)


@pytest.mark.parametrize("loop", ["overlap", "normal"])
@pytest.mark.parametrize("name", LEGAL)
def test_legal_disciplines_preempt_and_stay_clean(name: str, loop: str) -> None:
    result, made = run(name, named_scenario("preemption").with_config(loop=loop))
    assert result.ok, result.violations[0].line()
    assert made.count("preemptions") >= 4
    labels = {op.label[0] for op in result.trace.ops if op.kind == "forward"}
    assert "M" in labels  # recompute chunks and decodes in one forward


@pytest.mark.slow
@pytest.mark.parametrize("name", LEGAL)
def test_legal_disciplines_pass_every_named_scenario(name: str) -> None:
    for scenario in NAMED:
        result, _ = run(name, named_scenario(scenario))
        assert result.ok, (scenario, result.violations[0].line())


def test_chunked_re_prefill_after_preemption_is_not_extra_work() -> None:
    # Recomputes of 20+ tokens in chunks of 8: the non-final chunks reach past the prompt.
    scenario = named_scenario("preemption").with_config(max_extend_tokens=8)
    result, made = run("make_scheduler", scenario)
    assert result.ok, result.violations[0].line()
    assert made.count("preemptions") > 0
    prompt = {r.uid: len(r.prompt) for r in scenario.requests}
    reaching = dict.fromkeys(prompt, 0)  # forwards whose context reaches past the prompt
    for op in result.trace.ops:
        if op.kind == "forward":
            ends = context_ends(op, scenario.config.max_seq_len).tolist()
            for uid, end in zip(op.uids, ends, strict=True):
                reaching[uid] += end >= prompt[uid]
    assert max(reaching.values()) > 14  # more such forwards than max_tokens, yet clean


def test_discarded_in_flight_result_sampled_again_is_clean() -> None:
    result, made = run("make_discard_scheduler", named_scenario("preemption"))
    assert result.ok, result.violations[0].line()
    assert made.count("dropped") > 0


def test_a_dropped_result_sent_as_well_is_caught() -> None:
    result, _ = run("make_resend_scheduler", named_scenario("preemption"))
    assert first(result) in ("oracle", "exact-length")


def test_decoding_past_max_tokens_after_a_recompute_is_caught() -> None:
    result, _ = run("make_over_decode_scheduler", named_scenario("preemption"))
    assert first(result) == "work-bound"
    assert "needs only 14" in result.violations[0].message


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_stream_ordered_slot_reuse_is_clean(loop: str) -> None:
    for name in ("make_stream_ordered_scheduler", "make_stream_ordered_discard_scheduler"):
        result, _ = run(name, REUSE.with_config(loop=loop))
        assert result.ok, result.violations[0].line()
        assert [o.tokens for o in result.outcomes] == [[41, 2], [51, 52, 53]]


def test_unordered_slot_reuse_is_caught_by_the_slot_check_and_as_a_race() -> None:
    result, _ = run("make_unordered_reuse_scheduler", REUSE)
    assert first(result) == "slot-not-in-flight"
    assert "still in flight" in result.violations[0].message
    assert "h2d page_table" in result.violations[0].message
    race, _ = run("make_unordered_reuse_scheduler", REUSE, ["no-race"])
    assert first(race) == "no-race"
    normal, _ = run("make_unordered_reuse_scheduler", REUSE.with_config(loop="normal"))
    assert normal.ok  # nothing in flight at a reuse: the same code is right there


# Two requests that fit together only until each has decoded a few tokens.
TIGHT = Scenario(
    "tight",
    SchedulerConfig(num_slots=2, num_pages=24),
    tuple(RequestSpec(u, tuple(range(10 + u, 20 + u)), max_tokens=14) for u in range(2)),
)


def test_a_zero_progress_preemption_cascade_is_a_progress_finding() -> None:
    result, made = run("make_cascade_scheduler", TIGHT)
    assert first(result) == "progress"
    assert "no request gained a token in 8 iterations" in result.violations[0].message
    assert result.violations[0].step < 20  # at the bound, not at the liveness step bound
    assert made.count("preemptions") > 4
    legal, made = run("make_discard_scheduler", TIGHT)
    assert legal.ok and made.count("preemptions") > 0
