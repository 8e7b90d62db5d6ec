"""mini-sglang's books make the free list from the last one read (`LastList`): always the list
the array holds, the last one's int objects where it only lost its head or gained a tail."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("torch")  # (the adapter's package imports it)

from overlapcheck.adapters.minisgl.books import LastList


def test_the_list_is_always_the_arrays_and_shares_the_last_ones_ints() -> None:
    rng = random.Random(3)
    last = LastList()
    values = np.arange(100, 400, dtype=np.int32)
    shared = 0
    for _ in range(300):
        move = rng.randrange(4)
        if move == 0:  # taken from the head
            values = values[rng.randrange(0, 5) :]
        elif move == 1:  # given back at the tail
            values = np.concatenate([values, np.arange(5, dtype=np.int32) + 1000])
        elif move == 2 and len(values):  # changed in place (the tensor read last time), mid-list
            values[len(values) // 2] += 7
        else:  # reordered
            values = values[::-1].copy()
        before = last.pages
        pages = last.of(values)
        assert pages == tuple(values.tolist())
        if move == 0 and pages and before:
            assert pages[0] is before[len(before) - len(pages)]
            shared += 1
    assert shared > 30
