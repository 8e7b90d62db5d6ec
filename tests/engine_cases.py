"""What the CPU and CUDA engine tests share: the configuration matrix and the ok-check."""

from __future__ import annotations

import itertools

from overlapcheck.runner import RunResult

MATRIX = list(itertools.product(("overlap", "normal"), ("radix", "naive"), (1, 4)))


def ok(result: RunResult) -> None:
    assert result.ok, [v.line() for v in result.violations]
