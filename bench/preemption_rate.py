"""How often generated workloads make a scheduler preempt: the share of generated examples (the
search's own strategy, drawn timings) in which a scheduler that takes KV pages on demand preempts
at least once, as the scheduler counts it (its `preemptions`). The default scheduler is the
on-demand example.

    python -m overlapcheck.bench.preemption_rate [COUNT] [SCHEDULER_SPEC]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from overlapcheck.bench.generated import Example, each_example
from overlapcheck.core.errors import UserError
from overlapcheck.harness.scheduler_spec import SchedulerSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ondemand_scheduler.py"
DEFAULT_SCHEDULER = f"{EXAMPLE}:make_scheduler"


@runtime_checkable
class CountsPreemptions(Protocol):
    """A scheduler that says how often it preempted (the example and the reference do)."""

    @property
    def preemptions(self) -> int: ...


@dataclass
class Rate:
    examples: int = 0
    preempted: int = 0  # examples with at least one preemption
    preemptions: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.preempted / self.examples if self.examples else 0.0


def run(count: int, spec: str = DEFAULT_SCHEDULER, seed: int = 0) -> Rate:
    out = Rate()

    def visit(example: Example) -> None:
        scheduler = example.result.scheduler
        if not isinstance(scheduler, CountsPreemptions):
            raise UserError(f"{spec}: the scheduler has no `preemptions` count to read")
        out.preempted += scheduler.preemptions > 0
        out.preemptions += scheduler.preemptions
        out.violations.extend(v.line() for v in example.result.violations)

    out.examples = each_example(count, seed, visit, SchedulerSpec(spec).factory())
    return out


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 1000
    spec = argv[1] if len(argv) > 1 else DEFAULT_SCHEDULER
    rate = run(count, spec)
    print(
        f"examples: {rate.examples}, preempted in {rate.preempted} ({rate.share:.1%}), "
        f"{rate.preemptions} preemptions, violations: {len(rate.violations)}"
    )
    for line in rate.violations[:20]:
        print("  " + line)
    return 1 if rate.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
