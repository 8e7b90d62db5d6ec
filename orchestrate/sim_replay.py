"""Replay a counterexample on the simulator: the recorded scenario, timing draws and checks."""

from __future__ import annotations

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec


def replay_on_sim(cex: Counterexample, scheduler: SchedulerSpec | None = None) -> RunResult:
    """Run `cex` as recorded, with the recorded scheduler unless `scheduler` overrides it."""
    spec = scheduler or cex.scheduler
    factory = None if spec.is_reference else spec.factory()
    return run_scenario(cex.scenario, SimBackend(cex.timing()), cex.checks, scheduler=factory)
