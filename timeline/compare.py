"""Overlap vs normal: the same scenario run with both loops, drawn on one time axis.

The picture that explains overlap scheduling: in the normal loop the engine stream waits while the
host processes batch N and schedules N+1; in the overlap loop that host work runs under forward N+1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from overlapcheck.backends.base import Backend
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.timeline.model import Interval, Panel, Rendered
from overlapcheck.timeline.render import render_panels, result_title, violation_title

LOOPS = ("overlap", "normal")


def run_both(
    scenario: Scenario,
    make_backend: Callable[[], Backend],
    scheduler: SchedulerSpec | None = None,
) -> tuple[RunResult, RunResult]:
    """The scenario with the overlap loop, then with the normal loop, each on a fresh backend."""
    overlap, normal = (
        run_scenario(scenario.with_config(loop=loop), make_backend(), scheduler=scheduler)
        for loop in LOOPS
    )
    return overlap, normal


def render_compare(
    overlap: RunResult, normal: RunResult, out: str | Path, window: Interval | None = None
) -> Rendered:
    panels = [_panel(r) for r in (overlap, normal)]
    saved = 1 - overlap.simulated_seconds / max(normal.simulated_seconds, 1e-12)
    verdict = f"finishes {saved:.0%} sooner" if saved >= 0 else f"takes {-saved:.0%} longer"
    suptitle = f"{overlap.scenario.name}: overlap vs normal loop (overlap {verdict})"
    return render_panels(panels, out, window, suptitle)


def render_backends(
    real: RunResult, sim: RunResult, out: str | Path, window: Interval | None = None
) -> Rendered:
    """A real device's timeline (CUDA-event times) above the simulator's for the same scenario."""
    panels = [_panel(r) for r in (real, sim)]
    error = sim.simulated_seconds / max(real.simulated_seconds, 1e-12) - 1
    suptitle = (
        f"{real.scenario.name}: {real.backend} vs simulator (simulator {error:+.0%} on total)"
    )
    return render_panels(panels, out, window, suptitle)


def _panel(result: RunResult) -> Panel:
    violation = next(iter(result.violations), None)
    title = violation_title(result_title(result), violation)
    return Panel(result.trace, title, result.simulated_seconds, violation)
