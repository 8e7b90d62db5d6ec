"""mini-sglang's own scheduler under the simulated CUDA beside the reference scheduler on the
simulator: iterations per wall second on one workload (a steady decode batch of 8).

The difference is the cost of running real torch code: every aten op of mini-sglang's scheduler
goes through the dispatch mode, is traced with its cells, and runs twice (at issue on the logical
copies, in simulated time on the physical ones), where the reference talks to the device seam in
a dozen calls per iteration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.core.protocol import SchedulerFactory
from overlapcheck.harness.runner import run_scenario

SPEC = "overlapcheck.adapters.minisgl:make_scheduler"
REFERENCE = "reference (sim)"


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
    name: str, factory: SchedulerFactory | None, checks: list[str] | None, label: str, repeats: int
) -> Row:
    scenario = decode_workload(max_tokens=48)
    walls, iterations = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = run_scenario(scenario, SimBackend(), checks, scheduler=factory, keep_going=True)
        walls.append(time.perf_counter() - start)
        iterations = result.iterations
    return Row(name, label, iterations, min(walls))


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no mini-sglang checkout is found."""
    from overlapcheck.adapters.minisgl import make_scheduler

    _measure("mini-sglang", make_scheduler, [], "warm-up", 1)  # imports torch and mini-sglang
    rows = []
    for checks, label in (([], "footprints only"), (None, "all invariants")):
        rows.append(_measure(REFERENCE, None, checks, label, repeats))
        rows.append(
            _measure("mini-sglang (simulated CUDA)", make_scheduler, checks, label, repeats)
        )
    print(f"mini-sglang vs reference: decode batch 8, 48 tokens per request (best of {repeats})")
    print(
        f"{'scheduler':<30}{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}"
        f"{'of reference':>14}"
    )
    reference = {r.checks: r.iterations_per_second for r in rows if r.scheduler == REFERENCE}
    for r in rows:
        share = r.iterations_per_second / reference[r.checks]
        print(
            f"{r.scheduler:<30}{r.checks:<18}{r.iterations:>11}{r.best_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.1f}{share:>13.1%}"
        )
    return rows
