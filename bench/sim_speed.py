"""Simulated scheduler iterations per wall second: decode batch of 8, overlap loop, footprints
on."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import run_scenario


@dataclass(frozen=True, slots=True)
class SpeedResult:
    invariants: str
    iterations: int
    wall_seconds: float  # the fastest of the repeats
    simulated_seconds: float
    median_wall_seconds: float  # the middle one: what a noisy machine gives most of the time

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


def measure(invariants: list[str] | None, label: str, repeats: int = 5) -> SpeedResult:
    scenario = decode_workload()
    walls: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run_scenario(scenario, SimBackend(), invariants)
        walls.append(time.perf_counter() - start)
        assert result.ok, result.violations
    walls.sort()
    return SpeedResult(
        label, result.iterations, walls[0], result.simulated_seconds, walls[len(walls) // 2]
    )


def main() -> list[SpeedResult]:
    rows = [
        measure([], "footprints only"),
        measure(["no-race"], "no-race"),
        measure(None, "all invariants"),
    ]
    print("simulator speed: decode batch 8, overlap loop, 256 tokens per request (5 runs)")
    print(
        f"{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}{'median':>10}{'sim/wall':>10}"
    )
    for r in rows:
        print(
            f"{r.invariants:<18}{r.iterations:>11}{r.wall_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.0f}{r.median_iterations_per_second:>10.0f}"
            f"{r.sim_to_wall:>10.4f}"
        )
    return rows


if __name__ == "__main__":
    main()
