"""Same inputs, same trace, byte for byte, in any process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import SeededDelay, Timing
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.named import named_scenario


def hash_in_process(hashseed: str, scenario: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "overlapcheck.cli",
            "run",
            "--scenario",
            scenario,
            "--seed",
            "7",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["trace_hash"])


def test_trace_hash_is_the_same_in_two_processes_with_different_hash_seeds() -> None:
    for scenario in ("shared-prefix", "abort"):
        assert hash_in_process("1", scenario) == hash_in_process("12345", scenario)


def test_seeded_timing_changes_the_trace_and_repeats_it() -> None:
    scenario = named_scenario("basic")
    a = run_scenario(scenario, SimBackend(Timing(source=SeededDelay(1))))
    b = run_scenario(scenario, SimBackend(Timing(source=SeededDelay(1))))
    c = run_scenario(scenario, SimBackend(Timing(source=SeededDelay(2))))
    assert a.trace_hash == b.trace_hash
    assert a.trace_hash != c.trace_hash
    assert [o.tokens for o in a.outcomes] == [
        o.tokens for o in c.outcomes
    ]  # timing is not semantics
