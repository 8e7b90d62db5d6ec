"""Queue policies on shared-prefix workloads (simulator): cache reuse, work, latency, fairness.

Per workload and policy: prefix-cache hit rate (cached prompt tokens / prompt tokens), prefill
tokens computed, completion time of the whole workload, p50/p99 time from arrival to first token
(simulated), and the most later arrivals any one request was overtaken by. Then `lpm-aging` for a
few aging rates, and how often the cache miss of `hit_stream` is overtaken under each policy. Every
run has all invariants on; a violation aborts the benchmark.

    python -m overlapcheck.bench.policies          overlapcheck bench --policies
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.policy_workloads import WORKLOADS
from overlapcheck.core.config import POLICIES, PolicyKind
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.fairness import BoundedWait
from overlapcheck.invariants.registry import INVARIANTS
from overlapcheck.scenarios.fairness import VICTIM, hit_stream

UNBOUNDED = 10**9  # bounded-wait with a bound no run reaches: it only counts


@dataclass(frozen=True, slots=True)
class PolicyRow:
    workload: str
    policy: str
    hit_rate: float
    prefill_tokens: int
    completion_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    max_overtaken: int


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def checked_run(scenario: Scenario, policy: PolicyKind, **config: Any) -> RunResult:
    sc = replace(scenario, config=replace(scenario.config, policy=policy, **config))
    result = run_scenario(sc, SimBackend(), [*INVARIANTS, f"bounded-wait={UNBOUNDED}"])
    if not result.ok:
        raise RuntimeError(f"{sc.name} under {policy}: {result.violations[0].line()}")
    return result


def fairness(result: RunResult) -> BoundedWait:
    assert result.scheduler is not None
    return next(c for c in result.checks if isinstance(c, BoundedWait))


def measure(scenario: Scenario, policy: PolicyKind, **config: Any) -> PolicyRow:
    return row(checked_run(scenario, policy, **config), policy)


def row(result: RunResult, policy: str) -> PolicyRow:
    sched = result.scheduler
    assert sched is not None
    prefill = sched.prefill
    arrival = {s.uid: s.arrival for s in result.scenario.requests}
    first: dict[int, float] = {}
    for m in result.trace.messages:
        if m.kind == "token" and m.uid not in first:
            first[m.uid] = m.time
    ttft = [(first[u] - arrival[u]) * 1e3 for u in sorted(first)]
    return PolicyRow(
        workload=result.scenario.name,
        policy=policy,
        hit_rate=prefill.cached_tokens / max(1, prefill.prompt_tokens),
        prefill_tokens=prefill.prompt_tokens - prefill.cached_tokens,
        completion_ms=result.simulated_seconds * 1e3,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        max_overtaken=fairness(result).max_overtaken,
    )


HEADER = (
    "workload",
    "policy",
    "hit rate",
    "prefill tok",
    "done ms",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "max overtaken",
)


def table(rows: Sequence[PolicyRow]) -> str:
    """A Markdown table (reads as plain text in a terminal too)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = (
            r.workload,
            r.policy,
            f"{r.hit_rate:.1%}",
            f"{r.prefill_tokens}",
            f"{r.completion_ms:.2f}",
            f"{r.ttft_p50_ms:.2f}",
            f"{r.ttft_p99_ms:.2f}",
            f"{r.max_overtaken}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aging_sweep(rates: Sequence[int] = (1, 4, 16, 64)) -> list[PolicyRow]:
    scenario = WORKLOADS["system-prompts"]()
    rows = [measure(scenario, "lpm-aging", aging_tokens_per_pass=a) for a in rates]
    return [replace(r, policy=f"lpm-aging a={a}") for r, a in zip(rows, rates, strict=True)]


FAIR_POLICIES: tuple[PolicyKind, ...] = ("fcfs", "lpm", "dfs-weight", "hrrn", "lpm-aging")


def starvation(
    gaps_us: Sequence[float] = (100.0, 300.0, 400.0), streams: Sequence[int] = (20, 40)
) -> str:
    """How many hits overtake the cache miss of `hit_stream`, per policy."""
    lines = [
        "| hit every | hits | " + " | ".join(FAIR_POLICIES) + " |",
        "|" + "---|" * (2 + len(FAIR_POLICIES)),
    ]
    for gap in gaps_us:
        for hits in streams:
            scenario = hit_stream(hits=hits, gap_us=gap)
            counts = [
                len(fairness(checked_run(scenario, p)).overtakers[VICTIM]) for p in FAIR_POLICIES
            ]
            lines.append(f"| {gap:g} µs | {hits} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def main(policies: Sequence[PolicyKind] = POLICIES) -> list[PolicyRow]:
    rows = []
    for build in WORKLOADS.values():
        scenario = build()
        rows += [measure(scenario, p) for p in policies]
    print("queue policies, simulator, nominal timing, all invariants on")
    for name, build in WORKLOADS.items():
        print(f"  {name}: {build().description}")
    print(table(rows))
    print("\nlpm-aging on system-prompts by aging_tokens_per_pass (a)")
    print(table(aging_sweep()))
    print("\nhit_stream: later arrivals admitted before the cache miss (uid 1), one slot")
    print(starvation())
    return rows


if __name__ == "__main__":
    main()
