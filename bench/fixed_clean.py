"""The fixed scheduler against generated workloads with every kind in them (follow-up turns,
reused uids, long outputs, iteration-keyed arrivals and aborts, model EOS, big shapes) and drawn
timings: how many examples ran, and every violation found (expected: none).

    python -m overlapcheck.bench.fixed_clean [COUNT] [SEED] [--speculative]
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.speculative import speculating
from overlapcheck.scenarios.strategies import HypothesisDelay, scenarios


@dataclass
class CleanRun:
    examples: int = 0
    violations: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)  # how many examples had each kind


def kinds_of(scenario: Scenario) -> list[str]:
    """The new workload kinds a generated scenario contains."""
    reqs = scenario.requests
    cfg = scenario.config
    uids = [r.uid for r in reqs]
    found = {
        "follow-up": any(r.after is not None for r in reqs),
        "uid-reuse": len(set(uids)) < len(uids),
        "long": any(r.max_tokens > 8 for r in reqs),
        "arrival-iteration": any(r.arrival_iteration is not None for r in reqs),
        "abort-iteration": any(r.abort_iteration is not None for r in reqs),
        "model-eos": scenario.eos_probability > 0,
        "big-shape": cfg.max_seq_len > 48,
        f"preemption-{cfg.preemption}": cfg.preemption != "none",
        "speculative": cfg.draft_tokens > 0,
    }
    return [k for k, v in found.items() if v]


def run(count: int, seed: int = 0, speculative: bool = False) -> CleanRun:
    """`speculative`: speculation on in every example (else in the share the generator draws)."""
    out = CleanRun()

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def example(data: st.DataObject) -> None:
        scenario = data.draw(scenarios())
        if speculative and not scenario.config.draft_tokens:
            config, reqs = data.draw(speculating(scenario.config, scenario.requests))
            scenario = replace(scenario, config=config, requests=reqs)
        result = run_scenario(scenario, SimBackend(Timing(source=HypothesisDelay(data))))
        out.examples += 1
        out.kinds.update(kinds_of(scenario))
        out.violations.extend(v.line() for v in result.violations)

    example()
    return out


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 20_000
    seed = int(argv[1]) if len(argv) > 1 else 0
    result = run(count, seed, "--speculative" in argv[2:])
    print(f"examples: {result.examples}, violations: {len(result.violations)}")
    print("kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(result.kinds.items())))
    for line in result.violations[:20]:
        print("  " + line)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
