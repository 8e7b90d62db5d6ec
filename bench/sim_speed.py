"""Simulated scheduler iterations per wall second: decode batch of 8, overlap loop, footprints
on; and what the checks cost on top, as a ratio of CPU times from the same run.

The check sets run in turn, round after round, so that a load that comes and goes on a shared
machine weighs on each of them alike; the ratio is the median over the rounds of each round's
all-invariants CPU time over its footprints-only one (process time: time spent waiting for a
core does not count), printed with the quartiles of those ratios."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.runner import RunResult, run_scenario


@dataclass(frozen=True, slots=True)
class SpeedResult:
    invariants: str
    iterations: int
    wall_seconds: float  # the fastest of the repeats
    simulated_seconds: float
    median_wall_seconds: float  # the middle one: what a noisy machine gives most of the time
    cpu_seconds: float = 0.0  # the fastest of the repeats, in process time
    median_cpu_seconds: float = 0.0
    # this check set's CPU time over footprints-only's, round by round: the median
    cost_ratio: float = 1.0
    # the middle half of those ratios (the quartiles): how much the machine moved them
    cost_spread: tuple[float, float] = (1.0, 1.0)

    @property
    def iterations_per_second(self) -> float:
        return self.iterations / self.wall_seconds

    @property
    def median_iterations_per_second(self) -> float:
        return self.iterations / self.median_wall_seconds

    @property
    def sim_to_wall(self) -> float:
        return self.simulated_seconds / self.wall_seconds


def decode_workload(batch: int = 8, max_tokens: int = 256, prompt: int = 32) -> Scenario:
    rng = random.Random(0)
    reqs = tuple(
        RequestSpec(
            uid,
            tuple(rng.randrange(3, 1000) for _ in range(prompt)),
            max_tokens=max_tokens,
            ignore_eos=True,
        )
        for uid in range(batch)
    )
    config = SchedulerConfig(
        num_slots=batch, num_pages=batch * (prompt + max_tokens), max_seq_len=prompt + max_tokens
    )
    return Scenario("decode-8", config, reqs, "a steady decode batch")


CHECK_SETS: tuple[tuple[str, list[str] | None], ...] = (
    ("footprints only", []),
    ("no-race", ["no-race"]),
    ("all invariants", None),
)


# A run takes a fraction of a second, and on a shared or virtual machine one run in a few can
# take a third longer than its neighbours: 15 rounds give a median ratio that moves by a few
# hundredths between invocations where 5 rounds moved it by a tenth and more.
ROUNDS = 15


def measure(rounds: int = ROUNDS) -> list[SpeedResult]:
    """Each check set of `CHECK_SETS`, once per round, in turn, with the heap setting of the
    command line (`harness/heap.py`), whatever process calls it."""
    keep_freed_heap()
    scenario = decode_workload()
    walls: list[list[float]] = [[] for _ in CHECK_SETS]
    cpus: list[list[float]] = [[] for _ in CHECK_SETS]
    results: list[RunResult] = []
    for _ in range(rounds):
        results = []
        for i, (_, invariants) in enumerate(CHECK_SETS):
            start, cpu = time.perf_counter(), time.process_time()
            result = run_scenario(scenario, SimBackend(), invariants)
            cpus[i].append(time.process_time() - cpu)
            walls[i].append(time.perf_counter() - start)
            assert result.ok, result.violations
            results.append(result)
    rows = []
    for i, (label, _) in enumerate(CHECK_SETS):
        ratios = sorted(c / base for c, base in zip(cpus[i], cpus[0], strict=True))
        wall, cpu_time = sorted(walls[i]), sorted(cpus[i])
        rows.append(
            SpeedResult(
                label,
                results[i].iterations,
                wall[0],
                results[i].simulated_seconds,
                wall[len(wall) // 2],
                cpu_time[0],
                cpu_time[len(cpu_time) // 2],
                ratios[len(ratios) // 2],
                (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]),
            )
        )
    return rows


def main() -> list[SpeedResult]:
    rows = measure()
    print(
        f"simulator speed: decode batch 8, overlap loop, 256 tokens per request ({ROUNDS} rounds)"
    )
    print(
        f"{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}{'median':>10}{'sim/wall':>10}"
        f"{'cost':>7}{'middle half':>14}"
    )
    for r in rows:
        print(
            f"{r.invariants:<18}{r.iterations:>11}{r.wall_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.0f}{r.median_iterations_per_second:>10.0f}"
            f"{r.sim_to_wall:>10.4f}{r.cost_ratio:>6.2f}x"
            f"{r.cost_spread[0]:>8.2f}-{r.cost_spread[1]:.2f}"
        )
    print(
        "cost: CPU time over footprints only's, the median of the rounds' ratios "
        "(middle half: their quartiles)"
    )
    return rows


if __name__ == "__main__":
    main()
