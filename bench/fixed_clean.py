"""The fixed scheduler against generated workloads with every kind in them (follow-up turns,
reused uids, long outputs, iteration-keyed arrivals and aborts, model EOS, big shapes) and drawn
timings: how many examples ran, and every violation found (expected: none).

    python -m overlapcheck.bench.fixed_clean [COUNT] [SEED] [--speculative]

A violating example is saved as a counterexample file (unshrunk) when `out` is given, so that a
false alarm found in a long run replays with `overlapcheck replay FILE`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from hypothesis import strategies as st

from overlapcheck.bench.generated import Example, each_example
from overlapcheck.bench.preemption_modes import PreemptionMode
from overlapcheck.core.scenario import Scenario
from overlapcheck.formats import counterexample
from overlapcheck.harness.revision import git_revision
from overlapcheck.scenarios.speculative import speculating

# A run that goes wrong everywhere saves a few files, not thousands.
SAVED_AT_MOST = 5


@dataclass
class CleanRun:
    examples: int = 0
    violations: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)  # how many examples had each kind
    preempted: int = 0  # examples in which the scheduler preempted at least once
    saved: list[str] = field(default_factory=list)  # counterexample files of violating examples


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
    if cfg.draft_tokens:  # speculation together with the other kinds
        found |= {
            f"speculative+preemption-{cfg.preemption}": cfg.preemption != "none",
            "speculative+chunked": any(len(r.prompt) > cfg.max_extend_tokens for r in reqs),
            "speculative+abort": any(
                r.abort_at is not None or r.abort_iteration is not None or r.abort_after
                for r in reqs
            ),
            "speculative+uid-reuse": found["uid-reuse"],
        }
    return [k for k, v in found.items() if v]


def save(example: Example, out: Path) -> Path:
    """A violating example as a counterexample file in `out` (unshrunk: it was never searched)."""
    timing = example.timing
    cex = counterexample.Counterexample.of_run(
        example.result, timing.profile, timing.draws, git=git_revision()
    )
    return cex.save(out, unshrunk=True)


def run(
    count: int,
    seed: int = 0,
    speculative: bool = False,
    mode: PreemptionMode | None = None,
    out: Path | None = None,
) -> CleanRun:
    """`speculative`: speculation on in every example (else in the share the generator draws);
    `mode`: every example in that preemption mode (else as the generator draws it)."""
    clean = CleanRun()

    def adjust(data: st.DataObject, scenario: Scenario) -> Scenario:
        if speculative and not scenario.config.draft_tokens:
            config, reqs = data.draw(speculating(scenario.config, scenario.requests))
            scenario = replace(scenario, config=config, requests=reqs)
        return scenario if mode is None else mode.pin(scenario)

    def visit(example: Example) -> None:
        result = example.result
        clean.kinds.update(kinds_of(result.scenario))
        clean.preempted += result.scheduler.preemptions > 0
        clean.violations.extend(v.line() for v in result.violations)
        if result.violations and out is not None and len(clean.saved) < SAVED_AT_MOST:
            clean.saved.append(str(save(example, out)))

    clean.examples = each_example(count, seed, visit, adjust=adjust)
    return clean


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
