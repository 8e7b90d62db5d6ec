"""A counterexample as a Markdown bug report upstream can act on (`overlapcheck report`): what
goes wrong in the engine's words, the lines (both sides), the minimal workload, the interleaving
and its picture, the command that replays it, and a fix to try."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.sites import Location
from overlapcheck.core.trace import HOST, Op, TraceView
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.fixes import fix_to_try

MAX_STEPS = 40  # lines of the interleaving at most
# Host operations worth a line of the interleaving: what orders the host after the streams.
_HOST_KINDS = frozenset({"host_wait", "host_query", "read_output", "stage"})
# The caching allocators' own events (torchsim): bookkeeping, not the program's operations.
_ALLOCATORS = ("(pinned)", "(free)")


@dataclasses.dataclass(frozen=True, slots=True)
class ReportInput:
    """What a report says: the finding, the run it came from, where the file and picture are."""

    violation: Violation
    scenario: Scenario
    scheduler: str  # the scheduler spec, as `--scheduler` takes it
    counterexample: str  # the file's path, as the replay command names it
    trace: TraceView | None = None  # the replayed run's (None: not replayed)
    picture: str | None = None  # the timeline's PNG
    vocabulary: Mapping[str, str] = dataclasses.field(default_factory=dict)
    note: str = ""  # how the report was made, when not from a replay that reproduced the file
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)  # for the replay


def render(report: ReportInput) -> str:
    v = report.violation
    parts = [
        f"# `{v.invariant}`: {_words(_headline(v), report.vocabulary)}",
        "",
        f"Found by overlapcheck, a model checker of overlap schedulers, running the scheduler "
        f"`{report.scheduler}` on its simulated GPU; shrunk to "
        f"{len(report.scenario.requests)} request(s).",
    ]
    if report.note:
        parts += ["", f"> {report.note}"]
    parts += ["", "## What goes wrong", "", _words(v.message, report.vocabulary)]
    if v.uids:
        parts += ["", f"Requests involved: {', '.join(map(str, v.uids))}."]
    parts += ["", "## Where", ""]
    parts += _where(v.locations) or ["The finding names no line of the scheduler's code."]
    parts += ["", "## Minimal workload", "", *_workload(report.scenario)]
    parts += ["", "## The interleaving", ""]
    if report.trace is not None:
        parts += _interleaving(report.trace, v)
    else:
        parts += ["(not replayed: see the counterexample file's `trace`)"]
    if report.picture:
        parts += ["", f"Timeline: `{report.picture}` (one lane per stream; the violation marked)."]
    parts += ["", "## Replay", "", "```bash", *_replay(report), "```"]
    parts += ["", "## A fix to try", "", fix_to_try(v, report.vocabulary), ""]
    return "\n".join(parts)


def _headline(v: Violation) -> str:
    first = v.locations[0] if v.locations else None
    at = f" at `{first.file}:{first.line}`" if first is not None else ""
    return {
        "no-race": "two unordered accesses to the same device cells",
        "slot-not-in-flight": "a slot reused while a launched batch still uses it",
        "pages-conserved": "the KV page books do not add up",
        "abort-silent": "messages after an abort",
        "exact-length": "a request finished at the wrong length",
        "no-post-eos": "tokens after a request finished",
        "oracle": "tokens differ from the request run alone",
        "device-contract": "a device call outside the seam's contract",
        "no-crash": "the scheduler raised an exception",
    }.get(v.invariant, "a broken invariant") + at


def _words(text: str, vocabulary: Mapping[str, str]) -> str:
    """The message with the engine's words for ours, where the message has not used them."""
    for ours, theirs in vocabulary.items():
        text = text.replace(f" {ours} ", f" {theirs} ")
    return text


def _where(locations: Sequence[Location]) -> list[str]:
    if not locations:
        return []
    lines = [
        "| role | line | function | agent | step | operation |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for loc in locations:
        step = "" if loc.step is None else str(loc.step)
        what = f"`{loc.what}`" if loc.what else ""
        lines.append(
            f"| {loc.role} | `{loc.file}:{loc.line}` | `{loc.function}` | {loc.agent} | {step} "
            f"| {what} |"
        )
    roots = sorted({loc.root for loc in locations})
    lines += ["", "Paths are relative to " + ", ".join(f"`{r}`" for r in roots) + "."]
    return lines


def _workload(scenario: Scenario) -> list[str]:
    defaults = dataclasses.asdict(SchedulerConfig())
    config = scenario.to_json()["config"]
    changed = {k: v for k, v in config.items() if k in defaults and _plain(defaults[k]) != v}
    lines = ["Configuration (what differs from the defaults):", "", "```json"]
    lines += [json.dumps(changed), "```", "", "Requests:", "", "```json"]
    lines += [json.dumps(r.to_json()) for r in scenario.requests]
    lines.append("```")
    return lines


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, frozenset | set) else value


def _interleaving(trace: TraceView, v: Violation) -> list[str]:
    """The device work from the first step a location names to the violation's step, in issue
    order: stream operations, and the host's waits and reads; the ones at a location marked."""
    steps = [loc.step for loc in v.locations if loc.step is not None]
    low = min(steps, default=max(v.step - 1, 0))
    marked = {(loc.step, loc.agent, loc.what) for loc in v.locations}
    chosen = [
        op
        for op in trace.ops
        if low <= op.step <= v.step
        and (op.agent != HOST or op.kind in _HOST_KINDS)
        and op.phase != "idle"  # set-up before the first iteration
        and not op.label.endswith(_ALLOCATORS)
    ]
    lines = ["```text", "step  agent      operation"]
    for op in chosen[:MAX_STEPS]:
        mark = "  <--" if (op.step, op.agent, op.label or op.kind) in marked else ""
        lines.append(f"{op.step:>4}  {op.agent:<9}  {_op_text(op)}{mark}")
    if len(chosen) > MAX_STEPS:
        lines.append(f"      ... {len(chosen) - MAX_STEPS} more")
    lines.append("```")
    return lines


def _op_text(op: Op) -> str:
    return op.label or op.kind


def _replay(report: ReportInput) -> list[str]:
    env = " ".join(f"{k}={v}" for k, v in sorted(report.environment.items()))
    command = f"overlapcheck replay {report.counterexample}"
    return [f"{env} {command}" if env else command]


def write(report: ReportInput, out: str | Path | None) -> str:
    """The report's text; written to `out` when given (whole, then renamed)."""
    text = render(report)
    if out is not None:
        path = Path(out)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return text
