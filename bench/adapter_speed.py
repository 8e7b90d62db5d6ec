"""What the adapters' speed benchmarks share: one workload (a steady decode batch of 8, 48 tokens
a request), a run measured as the best of a few, and a table whose last column is each row's share
of the reference scheduler's iterations per second with the same checks."""

from __future__ import annotations

import time
from dataclasses import dataclass

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.protocol import SchedulerFactory
from overlapcheck.harness.runner import run_scenario

REFERENCE = "reference (sim)"
CHECK_SETS: tuple[tuple[list[str] | None, str], ...] = (
    ([], "footprints only"),
    (None, "all invariants"),
)


@dataclass(frozen=True, slots=True)
class Row:
    scheduler: str
    checks: str
    iterations: int
    best_seconds: float

    @property
    def iterations_per_second(self) -> float:
        return self.iterations / self.best_seconds


def measure(
    name: str,
    factory: SchedulerFactory | None,
    checks: list[str] | None,
    label: str,
    repeats: int,
    loop: str = "overlap",
) -> Row:
    """`repeats` runs of the workload with `factory` (None: the reference); the best wall time."""
    scenario = decode_workload(max_tokens=48).with_config(loop=loop)
    walls, iterations = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = run_scenario(scenario, SimBackend(), checks, scheduler=factory, keep_going=True)
        walls.append(time.perf_counter() - start)
        iterations = result.iterations
    return Row(name, label, iterations, min(walls))


def print_rows(title: str, rows: list[Row], repeats: int) -> None:
    print(f"{title}: decode batch 8, 48 tokens per request (best of {repeats})")
    print(
        f"{'scheduler':<30}{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}"
        f"{'of reference':>14}"
    )
    reference = {r.checks: r.iterations_per_second for r in rows if r.scheduler == REFERENCE}
    for r in rows:
        base = reference.get(r.checks)
        share = f"{r.iterations_per_second / base:>13.1%}" if base else f"{'':>13}"
        print(
            f"{r.scheduler:<30}{r.checks:<18}{r.iterations:>11}{r.best_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.1f}{share}"
        )
