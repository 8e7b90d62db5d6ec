"""The split of a run that `bench --minisgl` prints (`bench/dispatch_floor.py`): the time inside
the dispatch mode counted once per top-level op, the interceptor given back afterwards, and the
bound on the share it derives."""

from __future__ import annotations

import pytest
import simpy

torch = pytest.importorskip("torch")

from test_torchsim_allocator import _device  # noqa: E402

from overlapcheck.backends.torchsim.dispatch import Interceptor  # noqa: E402
from overlapcheck.backends.torchsim.session import SimulatedCuda  # noqa: E402
from overlapcheck.bench.dispatch_floor import Split, _Timed, crossing_seconds  # noqa: E402


def test_every_op_of_the_program_is_counted_and_the_interceptor_given_back() -> None:
    original, original_run = Interceptor.dispatch, simpy.Environment.run
    timed = _Timed()
    with SimulatedCuda(_device(), ("main",)), torch.inference_mode():
        pool = torch.zeros(8, device="cuda")
        with timed.installed():
            assert Interceptor.dispatch is not original
            pool.add_(1)
            pool[2:4].fill_(3)
            host = pool.cpu()  # a sync: the streams' work inside the dispatch
    assert Interceptor.dispatch is original and simpy.Environment.run is original_run
    assert host.tolist() == [1, 1, 3, 3, 1, 1, 1, 1]
    # add_, the view, fill_, and the copy to the host (`.cpu()` is one `_to_copy` at least)
    assert timed.ops >= 4
    assert timed.inside > 0.0 and timed.streams == 0.0


def test_the_bound_is_the_reference_over_the_outside_and_one_crossing_an_op() -> None:
    split = Split(wall=0.25, inside=0.1, streams=0.02, ops=5_000, reference=0.03, crossing=4e-6)
    assert split.rest == pytest.approx(0.13)
    assert split.floor == pytest.approx(0.15)
    assert split.best_share == pytest.approx(0.03 / 0.15)


def test_a_crossing_costs_something() -> None:
    assert crossing_seconds() > 0.0
