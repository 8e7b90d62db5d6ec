"""What the checks cost per iteration as a run gets longer: the decode batch of `sim_speed` at
several `max_tokens` (the pool and the rows grow with it), the time spent in each check's hooks
divided by the iterations. A check that walks everything seen so far instead of what changed
shows as a cost that climbs with the length.

    python -m overlapcheck.bench.check_growth [--scheduler SPEC] [--lengths 24,96,192,384]

(`--scheduler overlapcheck.adapters.minisgl:make_scheduler` with MINISGL_PATH set, say.) The
hooks are timed in the run itself (a difference of two whole runs' times drowns tens of
microseconds in the machine's noise); the fastest of `--rounds` runs is kept, per check. The first
check to ask for the scheduler's books in an iteration pays for reading them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.errors import UserError
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.base import Invariant
from overlapcheck.invariants.registry import INVARIANTS

_HOOKS = ("on_receive", "on_message", "on_ops", "on_step_end", "finish")


@contextmanager
def timed_hooks(spent: dict[str, float]) -> Iterator[None]:
    """While open, every invariant class's own hooks add their time to `spent[id]`."""
    classes = sorted({type(make()) for make in INVARIANTS.values()}, key=lambda c: c.__name__)
    saved: list[tuple[type[Invariant], str, Any]] = []
    for cls in classes:
        for name in _HOOKS:
            if name in cls.__dict__:
                saved.append((cls, name, cls.__dict__[name]))
                setattr(cls, name, _timed(cls.__dict__[name], cls.id, spent))
    try:
        yield
    finally:
        for cls, name, hook in saved:
            setattr(cls, name, hook)


def _timed(hook: Callable[..., None], key: str, spent: dict[str, float]) -> Callable[..., None]:
    def timed(*args: Any) -> None:
        start = time.perf_counter()
        try:
            hook(*args)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

    timed.__name__ = hook.__name__  # (the harness picks the hooks a class overrides by name)
    return timed


def measure(spec: SchedulerSpec, lengths: list[int], rounds: int) -> dict[int, dict[str, float]]:
    """Per length: each check's hooks' time in microseconds per iteration, and their sum
    (`all checks`)."""
    keep_freed_heap()
    found: dict[int, dict[str, float]] = {}
    for length in lengths:
        scenario = decode_workload(max_tokens=length)
        best: dict[str, float] = {}
        for _ in range(rounds):
            spent: dict[str, float] = {}
            with timed_hooks(spent):
                result = run_scenario(scenario, SimBackend(), scheduler=spec, keep_going=True)
            spent["all checks"] = sum(spent.values())
            for key, seconds in spent.items():
                us = seconds / result.iterations * 1e6
                best[key] = min(best.get(key, us), us)
        found[length] = best
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default="reference")
    parser.add_argument("--lengths", default="24,96,192,384")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        spec = SchedulerSpec.load(args.scheduler)
    except UserError as e:
        print(f"check_growth: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    lengths = [int(x) for x in args.lengths.split(",")]
    found = measure(spec, lengths, args.rounds)
    print(f"check cost, us per iteration ({args.scheduler})")
    print(f"{'max_tokens':>20s}" + "".join(f"{n:>9d}" for n in lengths))
    last = found[lengths[-1]]
    for key in sorted(last, key=lambda k: -last[k]):
        if last[key] >= 1.0 or key == "all checks":
            print(f"{key:>20s}" + "".join(f"{found[n].get(key, 0.0):9.1f}" for n in lengths))


if __name__ == "__main__":
    main()
