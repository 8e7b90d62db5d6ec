"""Findings name the scheduler's lines: structured locations (file relative to the scheduler's
root, line, function, agent, step), rendered into the message, carried by the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.cli import main
from overlapcheck.core.sites import Location, caller, source_root
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.loader import scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
# One slot; request 1 stops at EOS in its first decode, request 0 arrives next: with the slot
# freed at once (the fault), request 0's prefill takes the row while the stale round is in flight.
EARLY_FREE = {
    "name": "early-free",
    "config": {"num_slots": 1, "num_pages": 2, "page_size": 2, "faults": ["free-slot-early"]},
    "requests": [
        {"uid": 0, "prompt": [3], "max_tokens": 1, "arrival_iteration": 1},
        {"uid": 1, "prompt": [3], "max_tokens": 2, "continuation": [2]},
    ],
}


def test_a_slot_freed_early_names_the_free_the_reuse_and_the_batch_in_flight() -> None:
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    v = result.violations[0]
    assert v.invariant == "slot-not-in-flight"
    roles = [(loc.role, loc.file, loc.function, loc.agent) for loc in v.locations]
    assert [r[0] for r in roles] == ["freed", "reused", "in flight"]
    assert all(r[1] == "reference/scheduler.py" for r in roles)
    freed, reused, flight = v.locations
    assert (freed.agent, reused.agent, flight.agent) == ("host", "scheduler", "engine")
    assert freed.step == 1 and reused.step == 2 and flight.step == 1
    assert freed.root == str(ROOT)
    # the prose is rendered from them
    assert f"freed at reference/scheduler.py:{freed.line} in {freed.function}" in v.message
    assert v.to_json()["locations"][0] == freed.to_json()


def test_run_json_carries_the_locations(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "early.json"
    path.write_text(json.dumps(EARLY_FREE))
    assert main(["run", "--scenario", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    locs = out["violations"][0]["locations"]
    assert [loc["role"] for loc in locs] == ["freed", "reused", "in flight"]
    assert set(locs[0]) == {"role", "file", "line", "function", "root", "agent", "step", "what"}
    assert all(isinstance(loc["line"], int) and loc["line"] > 0 for loc in locs)


def test_files_are_named_relative_to_their_checkout_not_by_base_name(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "pyproject.toml").write_text("")
    one = tmp_path / "engine" / "sched" / "utils.py"
    two = tmp_path / "engine" / "kv" / "utils.py"
    assert source_root(str(one)) == str(tmp_path / "engine")
    a = Location.at("read", str(one), 3, "f")
    b = Location.at("write", str(two), 4, "g")
    assert (a.file, b.file) == ("sched/utils.py", "kv/utils.py")
    assert a.text() == "sched/utils.py:3 in f"
    assert Location.from_json(a.to_json()) == a
    # a loose file, in no checkout: named relative to its own folder
    loose = tmp_path / "mine.py"
    assert Location.at("x", str(loose), 1, "h").file == "mine.py"


def test_the_caller_is_the_schedulers_frame_not_the_machinery() -> None:
    # this test file is overlapcheck's (the checker's tree), so no frame here is a scheduler's
    assert caller(1) is None


def test_a_forward_without_its_metadata_staged_breaks_the_contract_at_its_line(
    tmp_path: Path, capsys: object
) -> None:
    source = (ROOT / "examples" / "minimal_scheduler.py").read_text()
    staged = "            self.staged = dev.stage_metadata(batch, dev.scheduler_stream)\n"
    assert source.count(staged) == 1
    mine = tmp_path / "mine.py"
    mine.write_text(source.replace(staged, "            self.staged = None\n"))
    assert main(["run", "--scheduler", f"{mine}:make_scheduler", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    (found,) = out["violations"]
    assert found["invariant"] == "device-contract"  # not a wrong token (`oracle`)
    assert "without its metadata staged" in found["message"]
    (at,) = found["locations"]
    assert (at["file"], at["function"]) == ("mine.py", "_launch")
    line = mine.read_text().splitlines()[at["line"] - 1]
    assert "dev.forward(batch" in line
