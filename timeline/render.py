"""Render a run, a trace or several runs to a file, choosing the format by the file's extension."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from overlapcheck.core.errors import UserError
from overlapcheck.core.trace import Trace
from overlapcheck.invariants.base import Violation
from overlapcheck.timeline.chrome import write_chrome
from overlapcheck.timeline.model import Interval, Panel, Rendered, summarise, trace_end

if TYPE_CHECKING:
    from overlapcheck.harness.runner import RunResult

FORMATS = (".png", ".svg", ".json", ".perfetto")
# Chrome Trace Event JSON, which ui.perfetto.dev opens whatever the name: `.perfetto` is what
# explore writes beside a counterexample, so `counterexamples/no-race-*.json` matches only it.
PERFETTO = (".json", ".perfetto")


def output_path(out: str | Path) -> Path:
    """`out` if its extension names a format we write and its folder exists; else a UserError."""
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise UserError(
            f"{path}: unknown timeline format {path.suffix or '(no extension)'!r}; "
            f"use {', '.join(FORMATS)}"
        )
    if not path.parent.is_dir():
        raise UserError(f"{path}: folder {path.parent} does not exist")
    return path


def render_panels(
    panels: Sequence[Panel], out: str | Path, window: Interval | None = None, suptitle: str = ""
) -> Rendered:
    path = output_path(out)
    if window is not None and not window[0] < window[1]:
        raise UserError(f"empty window {window[0] * 1e6:g}:{window[1] * 1e6:g} µs")
    if path.suffix.lower() in PERFETTO:
        # Perfetto zooms by itself: the JSON always holds the whole run.
        write_chrome(panels, path)
        return Rendered(path, tuple(summarise(p, None) for p in panels))
    from overlapcheck.timeline.plot import plot_panels  # matplotlib only when drawing

    return plot_panels(panels, path, window, suptitle)


def render_trace(
    trace: Trace,
    out: str | Path,
    violation: Violation | None = None,
    title: str = "",
    *,
    window: Interval | None = None,
    total: float | None = None,
) -> Rendered:
    """Draw one trace (and the violation it ends in, if any) to a .png, .svg or .json file.

    The title names the violation too: a counterexample's run is a generated scenario, so its
    file name and its invariant are what tell one picture from another."""
    end = trace_end(trace) if total is None else total
    panel = Panel(trace, violation_title(title or "trace", violation), end, violation)
    return render_panels([panel], out, window)


def render_result(result: RunResult, out: str | Path, window: Interval | None = None) -> Rendered:
    """Draw a run: its trace, its first violation, named after scenario, loop and backend."""
    violation = result.violations[0] if result.violations else None
    return render_trace(
        result.trace,
        out,
        violation,
        result_title(result),
        window=window,
        total=result.simulated_seconds,
    )


def result_title(result: RunResult) -> str:
    c = result.config
    faults = f", fault {'+'.join(sorted(c.faults))}" if c.faults else ""
    return f"{result.scenario.name}, {c.loop} loop ({result.backend}{faults})"


def violation_title(title: str, violation: Violation | None) -> str:
    """`title — invariant, step N` for a run that broke an invariant, else `title`."""
    if violation is None:
        return title
    return f"{title} — {violation.invariant}, step {violation.step}"
