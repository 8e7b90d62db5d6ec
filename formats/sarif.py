"""SARIF 2.1.0 output (`--sarif FILE` on `explore` and `replay`): the format code-scanning
services read, so that a CI job annotates the line a finding points at.

One result per finding: `ruleId` is the invariant's id, the message is the finding's line, the
first of its locations (`Violation.locations`, the line to look at first) is the result's
location and the others are related locations, each saying what happened there. Files are
relative to their scheduler's root, named in `originalUriBaseIds` (`ROOT0`, `ROOT1`, ...): each
with its folder on this machine (for a viewer here) and a description that names the tree as
upstream knows it (project, version, commit: `harness/source_tree.py`). A root in a git checkout
with a remote is given relative to the checkout's top (`REPO0`, ...), which
`versionControlProvenance` maps to the remote and commit: a viewer elsewhere finds the lines there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlapcheck import __version__
from overlapcheck.core.sites import Location
from overlapcheck.harness.source_tree import checkout_top, describe
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.registry import INVARIANTS

SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
# Findings that are no check of the registry, with what they state.
_OTHER_RULES = {
    "no-crash": "the scheduler raised an exception out of step()",
    "no-hang": "step() returned within the watchdog's wall-clock bound",
    "device-contract": "every device call is within the device seam's contract",
}


def _rule(invariant: str) -> dict[str, Any]:
    made = INVARIANTS.get(invariant)
    doc = (made.__doc__ or "") if isinstance(made, type) else ""
    summary = " ".join(doc.strip().split("\n\n")[0].split())  # the docstring's first paragraph
    text = summary or _OTHER_RULES.get(invariant, invariant)
    return {"id": invariant, "name": invariant, "shortDescription": {"text": text}}


def _physical(loc: Location, roots: dict[str, str]) -> dict[str, Any]:
    base = roots.setdefault(loc.root, f"ROOT{len(roots)}")
    return {
        "artifactLocation": {"uri": loc.file, "uriBaseId": base},
        "region": {"startLine": max(loc.line, 1)},
    }


def _said(loc: Location) -> str:
    who = ", ".join(p for p in (loc.agent, "" if loc.step is None else f"step {loc.step}") if p)
    what = f" `{loc.what}`" if loc.what else ""
    return f"{loc.role}{what} in {loc.function}" + (f" ({who})" if who else "")


def sarif_log(violations: Sequence[Violation], counterexample: str | None = None) -> dict[str, Any]:
    """The SARIF log of one run's findings (none: a clean run, an empty result list)."""
    roots: dict[str, str] = {}
    rule_ids: list[str] = []
    results = []
    for v in violations:
        if v.invariant not in rule_ids:
            rule_ids.append(v.invariant)
        result: dict[str, Any] = {
            "ruleId": v.invariant,
            "ruleIndex": rule_ids.index(v.invariant),
            "level": "error",
            "message": {"text": v.line()},
            "properties": {"step": v.step, "uids": list(v.uids)},
        }
        if counterexample is not None:
            result["properties"]["counterexample"] = counterexample
        if v.locations:
            first, *others = v.locations
            result["locations"] = [
                {"physicalLocation": _physical(first, roots), "message": {"text": _said(first)}}
            ]
            if others:
                result["relatedLocations"] = [
                    {
                        "id": i,
                        "physicalLocation": _physical(loc, roots),
                        "message": {"text": _said(loc)},
                    }
                    for i, loc in enumerate(others, start=1)
                ]
        results.append(result)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "overlapcheck",
                "version": __version__,
                "rules": [_rule(i) for i in rule_ids],
            }
        },
        "results": results,
    }
    if roots:
        named = [(root, base, _files(violations, root)) for root, base in roots.items()]
        run["originalUriBaseIds"], provenance = _bases(named)
        if provenance:
            run["versionControlProvenance"] = provenance
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}


def _files(violations: Sequence[Violation], root: str) -> list[str]:
    return [loc.file for v in violations for loc in v.locations if loc.root == root]


def _folder_uri(path: Path) -> str:
    return path.as_uri().rstrip("/") + "/"


def _bases(
    roots: Sequence[tuple[str, str, list[str]]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`originalUriBaseIds` for each (root, base id, files named there), and the
    `versionControlProvenance` of the checkouts among them that have a remote."""
    bases: dict[str, Any] = {}
    provenance: list[dict[str, Any]] = []
    repos: dict[Path, str] = {}
    for root, base, files in roots:
        tree = describe(root, files)
        entry: dict[str, Any] = {
            "uri": _folder_uri(Path(root)),
            "description": {"text": f"Paths are relative to {tree.text()}."},
        }
        top = checkout_top(root) if tree.remote and tree.commit else None
        if top is not None and tree.commit is not None:
            if top not in repos:
                repos[top] = f"REPO{len(repos)}"
                bases[repos[top]] = {"uri": _folder_uri(top)}
                provenance.append(
                    {
                        "repositoryUri": tree.remote,
                        "revisionId": tree.commit,
                        "mappedTo": {"uriBaseId": repos[top]},
                    }
                )
            inner = Path(root).resolve().relative_to(top).as_posix()
            entry["uri"] = f"{inner}/"  # "./" where the root is the top
            entry["uriBaseId"] = repos[top]
        bases[base] = entry
    return bases, provenance


def write_sarif(
    path: str | Path, violations: Sequence[Violation], counterexample: str | None = None
) -> None:
    """Write the log whole, then rename: a CI step never reads half a file."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(sarif_log(violations, counterexample), indent=1) + "\n")
    tmp.replace(out)
