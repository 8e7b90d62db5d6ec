"""vLLM's own scheduler under the simulated CUDA beside the reference scheduler on the simulator:
iterations per wall second on one workload (a steady decode batch of 8), for the async scheduler
with and without ngram drafts and for the synchronous one.

The difference is vLLM's own scheduling (its `schedule()` and `update_from_output()` are a few
milliseconds of Python a step) and the stand-in worker's torch code, every aten op of which goes
through the simulated CUDA's dispatch mode and is traced with its cells.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.protocol import SchedulerFactory
from overlapcheck.harness.runner import run_scenario


@dataclass(frozen=True, slots=True)
class Row:
    scheduler: str
    checks: str
    iterations: int
    best_seconds: float

    @property
    def iterations_per_second(self) -> float:
        return self.iterations / self.best_seconds


def _measure(
    name: str,
    factory: SchedulerFactory | None,
    checks: list[str] | None,
    label: str,
    repeats: int,
    loop: str = "overlap",
) -> Row:
    scenario = decode_workload(max_tokens=48).with_config(loop=loop)
    walls, iterations = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = run_scenario(scenario, SimBackend(), checks, scheduler=factory, keep_going=True)
        walls.append(time.perf_counter() - start)
        iterations = result.iterations
    return Row(name, label, iterations, min(walls))


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no vLLM tree or package is found."""
    from overlapcheck.adapters.vllm import (
        make_ngram_scheduler,
        make_scheduler,
        make_sync_scheduler,
    )

    _measure("vLLM", make_scheduler, [], "warm-up", 1)  # imports vLLM, builds its configs
    rows = []
    for checks, label in (([], "footprints only"), (None, "all invariants")):
        rows.append(_measure("reference (sim)", None, checks, label, repeats))
        rows.append(_measure("vLLM AsyncScheduler", make_scheduler, checks, label, repeats))
        rows.append(
            _measure("vLLM AsyncScheduler, k=3", make_ngram_scheduler, checks, label, repeats)
        )
        rows.append(
            _measure("vLLM Scheduler (sync)", make_sync_scheduler, checks, label, repeats, "normal")
        )
    print(f"vLLM vs reference: decode batch 8, 48 tokens per request (best of {repeats})")
    print(f"{'scheduler':<30}{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}")
    for r in rows:
        print(
            f"{r.scheduler:<30}{r.checks:<18}{r.iterations:>11}{r.best_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.1f}"
        )
    return rows
