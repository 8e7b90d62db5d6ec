"""`overlapcheck report COUNTEREXAMPLE [-o FILE]`: a Markdown bug report upstream can act on.

The counterexample is replayed on the simulator first, so that the report names the lines as
the code is now and draws the run; a replay that no longer reproduces the finding (the code
changed) reports from what the file recorded, and says so.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import cast

from overlapcheck.commands.paths import output_file
from overlapcheck.core.capability import provides
from overlapcheck.core.protocol import HasVocabulary
from overlapcheck.core.sites import Location
from overlapcheck.formats import counterexample
from overlapcheck.formats.finding_report import ReportInput, write
from overlapcheck.harness.runner import RunResult
from overlapcheck.invariants.base import Violation
from overlapcheck.replay.sim import replay_on_sim


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write a Markdown bug report of a counterexample: what goes wrong, where, the "
        "workload, the interleaving, the replay command and a fix to try",
    )
    p.add_argument("file", metavar="COUNTEREXAMPLE", help="a counterexample file (JSON)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the report here (.md) (default: print it on stdout)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    out = output_file(args.output, "report", (".md", ".markdown")) if args.output else None
    cex = counterexample.load(args.file)
    result = replay_on_sim(cex)
    found = cex.reproduced(result)
    note = ""
    violation: Violation
    if found is not None:
        violation = found
        if result.trace_hash != cex.trace_hash:
            note = (
                "The replay reproduced the finding with another trace than the file's (the "
                "scheduler's code, or overlapcheck's model of the GPU, changed since it was "
                "saved); the lines below are the code's now."
            )
    else:
        violation = _recorded(cex.data.get("violation"), cex.invariant)
        note = (
            f"The replay no longer reproduces `{cex.invariant}` (the code changed): this report "
            "is made from what the file recorded."
        )
    picture = _picture(result, violation, Path(args.file), out) if found is not None else None
    report = ReportInput(
        violation=violation,
        scenario=cex.scenario,
        scheduler=cex.scheduler.text,
        counterexample=args.file,
        trace=result.trace if found is not None else None,
        picture=picture,
        vocabulary=_vocabulary(result),
        note=note,
        environment=_environment(violation.locations),
        code=cex.code,
    )
    text = write(report, out)
    if out is None:
        sys.stdout.write(text)
    else:
        print(f"report: {out}", file=sys.stderr)
    return 0


def _recorded(data: object, invariant: str) -> Violation:
    """The file's own violation, as far as it says it (older files carry no locations)."""
    raw = data if isinstance(data, dict) else {}
    locations = raw.get("locations") or []
    return Violation(
        invariant=str(raw.get("invariant", invariant)),
        step=int(raw.get("step", 0)),
        time=float(raw.get("time", 0.0)),
        uids=tuple(int(u) for u in raw.get("uids", [])),
        message=str(raw.get("message", "")),
        details=dict(raw.get("details") or {}),
        locations=tuple(Location.from_json(loc) for loc in locations if isinstance(loc, dict)),
    )


def _vocabulary(result: RunResult) -> dict[str, str]:
    scheduler = result.scheduler
    if provides(scheduler, HasVocabulary):
        return dict(cast(HasVocabulary, scheduler).vocabulary())
    return {}


def _environment(locations: tuple[Location, ...]) -> dict[str, str]:
    """The environment variables that name the scheduler's tree (an adapter's checkout): the
    replay needs them set as they are now."""
    roots = {Path(loc.root).resolve() for loc in locations if loc.root}
    found = {}
    for name, value in sorted(os.environ.items()):
        if name in _SHELL or not value or "/" not in value or ":" in value:
            continue
        try:
            if Path(value).resolve() in roots:
                found[name] = value
        except (OSError, ValueError):
            continue
    return found


# The shell's own variables: a folder, but never how a scheduler is found.
_SHELL = frozenset({"PWD", "OLDPWD", "HOME", "VIRTUAL_ENV", "TMPDIR", "PYTHONPATH", "PATH"})


def _picture(result: RunResult, violation: Violation, file: Path, out: Path | None) -> str | None:
    """The timeline's PNG: beside the counterexample when explore drew it, else drawn beside
    the report (None without matplotlib)."""
    beside = file.with_suffix(".png")
    if beside.is_file():
        return str(beside)
    try:
        from overlapcheck.timeline.render import render_trace
    except ImportError:
        return None
    target = (out.parent if out is not None else file.parent) / f"{file.stem}.png"
    try:
        render_trace(result.trace, target, violation=violation, title=file.stem)
    except OSError:
        return None
    return str(target)
