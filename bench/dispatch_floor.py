"""Where a run of real code under the simulated CUDA goes, and the best share of the reference's
speed a Python dispatch mode could reach on it.

A run splits into the time inside the dispatch mode (every aten op the program calls: our
tracing, the op itself, the simulated time a sync runs), the streams' work in simulated time
outside it (the ops' second run on the physical copies as the streams reach them), and the rest
(the program's own Python, the adapter, the checks). Even a simulated CUDA that cost nothing but
torch's own crossing into a Python mode leaves the rest and one crossing an op; that sum, against
the reference's run, bounds the share any tuning of the simulation's Python can reach.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import simpy

from overlapcheck.bench import adapter_speed
from overlapcheck.core.protocol import SchedulerFactory

CROSSING_OPS = 3_000  # ops a crossing's cost is averaged over


@dataclass(frozen=True, slots=True)
class Split:
    """One run (the best of a few): its wall seconds, those inside the dispatch mode and its
    ops; the reference's run and one bare crossing, for the bound."""

    wall: float
    inside: float
    streams: float
    ops: int
    reference: float
    crossing: float

    @property
    def rest(self) -> float:
        return self.wall - self.inside - self.streams

    @property
    def floor(self) -> float:
        """The run with a simulated CUDA that cost only its crossings (the ops' own work not
        even counted): what no tuning of the simulation's Python gets below."""
        return self.rest + self.ops * self.crossing

    @property
    def best_share(self) -> float:
        return self.reference / self.floor


class _Timed:
    """Times the interceptor's top-level calls (a nested one is inside its caller's time) and
    the simulated time run outside them."""

    def __init__(self) -> None:
        self.inside = 0.0
        self.streams = 0.0
        self.ops = 0
        self._depth = 0

    @contextmanager
    def installed(self) -> Iterator[None]:
        from overlapcheck.backends.torchsim.dispatch import Interceptor

        original = Interceptor.dispatch
        original_run = simpy.Environment.run
        timed = self

        def run(self: simpy.Environment, until: Any = None) -> Any:
            if timed._depth:
                return original_run(self, until)
            start = time.perf_counter()
            try:
                return original_run(self, until)
            finally:
                timed.streams += time.perf_counter() - start

        def dispatch(self: Interceptor, func: Any, args: Any, kwargs: Any) -> Any:
            timed.ops += 1
            if timed._depth:
                return original(self, func, args, kwargs)
            timed._depth += 1
            start = time.perf_counter()
            try:
                return original(self, func, args, kwargs)
            finally:
                timed._depth -= 1
                timed.inside += time.perf_counter() - start

        Interceptor.dispatch = dispatch  # type: ignore[method-assign]
        simpy.Environment.run = run  # type: ignore[method-assign]
        try:
            yield
        finally:
            Interceptor.dispatch = original  # type: ignore[method-assign]
            simpy.Environment.run = original_run  # type: ignore[method-assign]


def crossing_seconds() -> float:
    """What one op costs more under a TorchDispatchMode that only calls it, than bare: torch's
    own crossing into Python and back (best of 5, small host ops)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Bare(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    cells = torch.zeros(64, dtype=torch.int32)

    def ops() -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(CROSSING_OPS // 3):
                view = cells[3:9]
                view.fill_(2)
                torch.arange(0, 6, out=view)
            best = min(best, time.perf_counter() - start)
        return best / CROSSING_OPS

    with torch.inference_mode():
        native = ops()
        with Bare():  # type: ignore[no-untyped-call]
            moded = ops()
    return max(moded - native, 0.0)


def measure(factory: SchedulerFactory, repeats: int = 3) -> Split:
    """The adapters' speed workload (`bench/adapter_speed.py`, every invariant) with `factory`,
    timed run by run, then the reference's best beside it."""
    adapter_speed.measure("", factory, None, "", 1)  # imports and first-call caches
    best: tuple[float, _Timed] | None = None
    for _ in range(repeats):
        timed = _Timed()
        with timed.installed():
            wall = adapter_speed.measure("", factory, None, "", 1).best_seconds
        if best is None or wall < best[0]:
            best = (wall, timed)
    assert best is not None
    wall, timed = best
    reference = adapter_speed.measure("", None, None, "", repeats).best_seconds
    return Split(wall, timed.inside, timed.streams, timed.ops, reference, crossing_seconds())


def print_split(name: str, split: Split) -> None:
    print(
        f"where a run of {name} goes (every invariant, best of the runs): {split.wall:.3f} s ="
        f" {split.inside:.3f} s inside the dispatch mode ({split.ops:,} ops) +"
        f" {split.streams:.3f} s of the streams' work outside it + {split.rest:.3f} s the rest"
        " (the program's Python, the adapter, the checks)"
    )
    print(
        f"a bare dispatch mode costs {split.crossing * 1e6:.1f} us an op over the op here; a"
        f" simulated CUDA costing only that would leave {split.floor:.3f} s a run: at most"
        f" {split.best_share:.1%} of the reference ({split.reference:.4f} s a run)"
    )
