"""What the CPU and CUDA engine tests share: the configuration matrix and the ok-check."""

from __future__ import annotations

import itertools

from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import RunResult
from overlapcheck.scenarios.named import named_scenario

MATRIX = list(itertools.product(("overlap", "normal"), ("radix", "naive"), (1, 4)))


def matrix_scenario(loop: str, cache: str, page_size: int) -> Scenario:
    """`shared-prefix` (prompts of 27-30 tokens: chunks of 8 split them) in one matrix cell."""
    base = named_scenario("shared-prefix")
    return base.with_config(
        loop=loop,
        cache=cache,
        page_size=page_size,
        max_extend_tokens=8,
        num_pages=base.config.num_pages // page_size,
    )


def ok(result: RunResult) -> None:
    assert result.ok, [v.line() for v in result.violations]
