"""A counterexample as a Markdown bug report upstream can act on (`overlapcheck report`): what
goes wrong in the engine's words, the lines (both sides), the minimal workload, the interleaving
and its picture, the command that replays it, and a fix to try.

The report travels to people without this machine: a source tree is named by its project, its
commit and whether it had local changes (`harness/source_tree.py`), its files relative to its
root, and no local folder of it appears (an environment variable naming it is shown as
`/path/to/<its folder's name>`)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.sites import Location
from overlapcheck.core.trace import HOST, Op, TraceView
from overlapcheck.harness.fingerprint import CodeFingerprint
from overlapcheck.harness.source_tree import describe
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
    code: CodeFingerprint | None = None  # what the file recorded of the scheduler's code
    folder: str | None = None  # where the report is written (None: printed)


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
    parts += _where(v.locations, report.code) or [
        "The finding names no line of the scheduler's code."
    ]
    parts += _call_path(v)
    parts += ["", "## Minimal workload", "", *_workload(report.scenario)]
    parts += ["", "## The interleaving", ""]
    if report.trace is not None:
        parts += _interleaving(report.trace, v)
    else:
        parts += ["(not replayed: see the counterexample file's `trace`)"]
    roots = _roots(report)
    if report.picture:
        picture = _shown(report.picture, roots, report.folder)
        parts += ["", f"Timeline: `{picture}` (one lane per stream; the violation marked)."]
    parts += ["", "## Replay", "", "```bash", *_replay(report, roots), "```"]
    parts += ["", "## A fix to try", "", fix_to_try(v, report.vocabulary), ""]
    return _relative("\n".join(parts), roots)


def _roots(report: ReportInput) -> list[str]:
    """The local folders of the scheduler's code the report may meet: its locations' roots and
    the recorded fingerprint's, innermost first."""
    found = {loc.root for loc in report.violation.locations if loc.root}
    if report.code is not None:
        found.update(root.path for root in report.code.roots)
    return sorted(found, key=lambda r: (-len(r), r))


def _relative(text: str, roots: Sequence[str]) -> str:
    """A local path under one of `roots` that reached the text (a message quoting a file, the
    engine's own exception text) named relative to its root, as the report's tables are."""
    for root in roots:
        if root not in ("", "/"):
            text = text.replace(root.rstrip("/") + "/", "")
    return text


def _shown(path: str, roots: Sequence[str], folder: str | None = None) -> str:
    """A file the report names: relative to the current folder when under it (the commands are
    run from there), else to the report's `folder`, else to the scheduler's tree holding it,
    else as given."""
    if not os.path.isabs(path):
        return path
    resolved = Path(path).resolve()
    bases = [Path.cwd(), *([Path(folder)] if folder else []), *(Path(r) for r in roots if r)]
    for base in (b.resolve() for b in bases):
        if resolved.is_relative_to(base) and resolved != base:
            return resolved.relative_to(base).as_posix()
    return path


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


def _where(locations: Sequence[Location], code: CodeFingerprint | None) -> list[str]:
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
    roots = sorted({loc.root for loc in locations if loc.root})  # (older files name none)
    trees = [
        describe(r, [loc.file for loc in locations if loc.root == r], code).text() for r in roots
    ]
    trees = trees or ["the root of the scheduler's source tree (the file does not name it)"]
    lines += ["", "Paths are relative to " + "; and to ".join(trees) + "."]
    return lines


def _call_path(v: Violation) -> list[str]:
    """The frames an exception passed through, outermost first, where the finding kept them."""
    frames = v.details.get("traceback") if isinstance(v.details, dict) else None
    if not isinstance(frames, list) or not frames:
        return []
    return ["", "Call path (outermost first):", "", "```text", *map(str, frames), "```"]


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


def _replay(report: ReportInput, roots: Sequence[str]) -> list[str]:
    # (a variable naming the tree: the reader's own copy of the tree named under "Where")
    env = " ".join(
        f"{k}=/path/to/{Path(v).resolve().name}" if "/" in v else f"{k}={v}"
        for k, v in sorted(report.environment.items())
    )
    command = f"overlapcheck replay {_shown(report.counterexample, roots)}"
    return [f"{env} {command}" if env else command]


def write(report: ReportInput, out: str | Path | None) -> str:
    """The report's text; written to `out` when given (whole, then renamed)."""
    if out is not None:
        report = dataclasses.replace(report, folder=str(Path(out).parent))
    text = render(report)
    if out is not None:
        path = Path(out)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return text
