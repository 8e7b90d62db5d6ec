"""The same verdicts and trace hashes as another revision, on generated examples.

For a change that must not change behaviour (a faster check, a refactor): N generated scenarios
(seeded, drawn once by this checkout's generator), each with seeded timing, run with every
invariant by this checkout and by REV (a temporary git worktree, each in a fresh process);
every trace hash and every violation line must agree. Examples cycle through the named faults,
so that verdicts with violations are compared too (the reference's faults: with `--scheduler`,
another scheduler under test, none).

    python -m overlapcheck.bench.same_verdicts --rev HEAD~1 --examples 300
    python -m overlapcheck.bench.same_verdicts --rev main --examples 60 \
        --scheduler overlapcheck.adapters.minisgl:make_scheduler    # MINISGL_PATH set
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from overlapcheck.bench.worktree import ROOT, add_rev_argument, revision_tree, run_from

_RUN = """
import json, sys
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, SeededDelay, Timing
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.scenarios.loader import scenario_from_dict
spec = SchedulerSpec.load(sys.argv[2])
for line in open(sys.argv[1]):
    job = json.loads(line)
    scenario = scenario_from_dict(job["scenario"])
    scenario = scenario.with_config(faults=frozenset(job["faults"]))
    backend = SimBackend(Timing(Profile(), SeededDelay(job["seed"])))
    result = run_scenario(scenario, backend, scheduler=spec)
    print(json.dumps([result.trace_hash, [v.line() for v in result.violations]]))
"""


def generate(examples: int, seed: int, with_faults: bool = True) -> list[dict[str, Any]]:
    """`examples` scenarios from the generator, the same for the same seed (cycling through the
    reference's faults when `with_faults`)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    from overlapcheck.reference.faults import FAULTS
    from overlapcheck.scenarios.strategies import scenarios

    faults = [[], *([f] for f in sorted(FAULTS))] if with_faults else [[]]
    jobs: list[dict[str, Any]] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=["generate"],  # type: ignore[list-item]
    )
    @given(scenarios())
    def draw(scenario: Any) -> None:
        i = len(jobs)
        jobs.append(
            {"scenario": scenario.to_json(), "faults": faults[i % len(faults)], "seed": seed + i}
        )

    draw()
    return jobs


def verdicts(tree: Path, jobs_file: Path, scheduler: str = "reference") -> list[Any]:
    out = run_from(tree, _RUN, str(jobs_file), scheduler)
    return [json.loads(line) for line in out.splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rev_argument(parser)
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scheduler", default="reference", help="the scheduler under test (as `run` takes it)"
    )
    parser.add_argument(
        "--verdicts-only",
        action="store_true",
        help="compare the violation lines only (a change that renames trace labels on purpose)",
    )
    args = parser.parse_args()
    jobs = generate(args.examples, args.seed, with_faults=args.scheduler == "reference")
    with tempfile.TemporaryDirectory(prefix="overlapcheck-verdicts-") as tmp:
        jobs_file = Path(tmp) / "jobs.jsonl"
        jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        with revision_tree(args.rev) as other:
            ours = verdicts(ROOT, jobs_file, args.scheduler)
            theirs = verdicts(other, jobs_file, args.scheduler)
    keep = 1 if args.verdicts_only else 0  # (each verdict: [trace hash, violation lines])
    pairs = enumerate(zip(ours, theirs, strict=True))
    differ = [i for i, (a, b) in pairs if a[keep:] != b[keep:]]
    violating = sum(bool(v[1]) for v in ours)
    print(
        f"{len(jobs)} generated examples ({violating} with a violation): "
        f"{len(jobs) - len(differ)} identical to {args.rev}, {len(differ)} differ"
        + (" (violations compared, not trace hashes)" if args.verdicts_only else "")
    )
    for i in differ[:10]:
        print(f"  example {i} ({jobs[i]['faults']}): {ours[i]} vs {theirs[i]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
