"""The differential matrix: every named scenario under every loop, cache, page size and chunk size
produces the sequential reference's tokens, with every invariant on and everything given back."""

from __future__ import annotations

import itertools

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.toy_model import ToyModel
from overlapcheck.core.rules import max_output
from overlapcheck.core.scenario import user_msg
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.named import NAMED, named_scenario

MATRIX = list(itertools.product(NAMED, ("overlap", "normal"), ("radix", "naive"), (1, 4), (4, 256)))


@pytest.mark.parametrize(("name", "loop", "cache", "page_size", "chunk"), MATRIX)
def test_tokens_equal_sequential_reference(
    name: str, loop: str, cache: str, page_size: int, chunk: int
) -> None:
    base = named_scenario(name)
    scenario = base.with_config(
        loop=loop,
        cache=cache,
        page_size=page_size,
        max_extend_tokens=chunk,
        num_pages=base.config.num_pages * base.config.page_size // page_size,
    )
    backend = SimBackend()
    result = run_scenario(scenario, backend)
    assert result.ok, [v.line() for v in result.violations]

    # Independently of the oracle invariant: the toy model run on each request alone.
    cfg = scenario.config
    model = ToyModel(cfg.vocab_size, cfg.eos_token_id, cfg.seed)
    for spec in scenario.requests:
        if spec.continuation:
            model.add_script(spec.prompt, spec.continuation)
    specs = {s.uid: s for s in scenario.requests}
    for outcome in result.outcomes:
        spec = specs[outcome.uid]
        reference = model.generate(spec.prompt, max_output(cfg, user_msg(spec)), spec.ignore_eos)
        if outcome.finish_reason == "abort":
            assert outcome.tokens == reference[: len(outcome.tokens)]
        else:
            assert outcome.finish_reason in ("length", "eos")
            assert outcome.tokens == reference

    # Idle: every slot and every page that is not cached came back, and the books balance.
    sched = result.scheduler
    assert sched is not None and not sched.held
    assert sched.table.num_free == cfg.num_slots
    assert sched.cache.allocator.num_free + sched.cache.prefix.num_cached_pages == cfg.num_pages
    sched.check_integrity()


def test_overlap_is_faster_than_normal_on_every_scenario() -> None:
    for name in NAMED:
        scenario = named_scenario(name)
        overlap = run_scenario(scenario.with_config(loop="overlap"), SimBackend())
        normal = run_scenario(scenario.with_config(loop="normal"), SimBackend())
        if name != "abort":  # its last event is a fixed-time abort, which bounds both runs
            assert overlap.simulated_seconds < normal.simulated_seconds, name
