"""What overlapcheck saves when it crashes itself: the input that reproduces it, and the error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from overlapcheck.harness.crash import CheckerBug


def save_checker_bug(bug: CheckerBug, folder: Path) -> Path:
    """Write `overlapcheck-bug-HASH.json` (a scenario file `run --scenario` loads) and a `.txt`
    beside it with the traceback and what else the run used (timing draws, scheduler)."""
    folder.mkdir(parents=True, exist_ok=True)
    scenario = bug.scenario.to_json()
    text = json.dumps(scenario, indent=1, sort_keys=True)
    name = "overlapcheck-bug-" + hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    path = folder / f"{name}.json"
    path.write_text(text + "\n")
    faults = sorted(bug.scenario.config.faults)
    lines = [
        f"overlapcheck bug: {bug}",
        f"reproduce: overlapcheck run --scenario {path}"
        + "".join(f" --fault {f}" for f in faults)
        + "".join(f" {k} {v}" for k, v in bug.extra.items() if k.startswith("--")),
        "",
        *(f"{k}: {json.dumps(v)}" for k, v in bug.extra.items() if not k.startswith("--")),
        "",
        bug.traceback_text(),
    ]
    path.with_suffix(".txt").write_text("\n".join(lines))
    return path
