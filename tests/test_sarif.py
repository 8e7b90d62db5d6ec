"""`--sarif FILE` on explore and replay: SARIF 2.1.0 that validates against the OASIS schema
(committed as test data), one result per finding at the scheduler's lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.core.sites import Location
from overlapcheck.formats import counterexample
from overlapcheck.formats.sarif import sarif_log
from overlapcheck.harness.runner import run_scenario
from overlapcheck.invariants.base import Violation
from overlapcheck.scenarios.loader import scenario_from_dict
from tests.test_locations import EARLY_FREE, ROOT

SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def valid(log: dict[str, Any]) -> dict[str, Any]:
    jsonschema.Draft4Validator(SCHEMA).validate(log)
    return log


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved counterexample of the early-free scenario."""
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    assert result.violations
    return counterexample.save(result, Profile(), {}, tmp_path_factory.mktemp("cex"))


def test_a_finding_is_one_result_at_the_line_with_the_other_side_related() -> None:
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    log = valid(sarif_log(result.violations[:1], "cex.json"))
    run = log["runs"][0]
    (res,) = run["results"]
    assert res["ruleId"] == "slot-not-in-flight"
    assert run["tool"]["driver"]["rules"][res["ruleIndex"]]["id"] == "slot-not-in-flight"
    where = res["locations"][0]["physicalLocation"]
    assert where["artifactLocation"] == {"uri": "reference/scheduler.py", "uriBaseId": "ROOT0"}
    assert where["region"]["startLine"] == result.violations[0].locations[0].line
    assert run["originalUriBaseIds"]["ROOT0"]["uri"] == ROOT.as_uri() + "/"
    related = [r["message"]["text"].split()[0] for r in res["relatedLocations"]]
    assert related == ["reused", "in"]  # the reuse, the batch in flight
    assert res["properties"]["counterexample"] == "cex.json"


def test_a_clean_log_is_valid_too() -> None:
    assert valid(sarif_log([]))["runs"][0]["results"] == []


def test_replay_writes_sarif(found: Path, tmp_path: Path) -> None:
    out = tmp_path / "found.sarif"
    assert main(["replay", str(found), "--sarif", str(out)]) == 1
    log = valid(json.loads(out.read_text()))
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["slot-not-in-flight"]


def test_explore_writes_sarif_when_it_finds_nothing(tmp_path: Path) -> None:
    out = tmp_path / "clean.sarif"
    argv = ["explore", "--scenario", "basic", "--max-examples", "2", "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "cex"), "--sarif", str(out)]) == 0
    assert valid(json.loads(out.read_text()))["runs"][0]["results"] == []


def test_explore_writes_sarif_for_its_finding(tmp_path: Path) -> None:
    scenario = tmp_path / "early.json"
    scenario.write_text(json.dumps(EARLY_FREE))
    out = tmp_path / "found.sarif"
    argv = ["explore", "--scenario", str(scenario), "--max-examples", "3", "--workers", "1"]
    argv += ["--out", str(tmp_path / "cex"), "--no-timeline", "--sarif", str(out)]
    assert main(argv) == 1
    (res,) = valid(json.loads(out.read_text()))["runs"][0]["results"]
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(".py")


def test_an_unwritable_sarif_path_is_one_line_and_exit_2(
    found: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(found), "--sarif", str(tmp_path / "no" / "x.sarif")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]


def test_every_rule_states_its_property() -> None:
    """A code-scanning service shows a rule's short description beside each finding: every
    invariant's is a sentence of what it checks, not its id again."""
    from overlapcheck.formats.sarif import _rule
    from overlapcheck.invariants.registry import INVARIANTS

    for invariant in INVARIANTS:
        text = _rule(invariant)["shortDescription"]["text"]
        assert text != invariant and len(text.split()) >= 6 and text.endswith((".", ".)")), text


def test_each_root_is_described_as_upstream_knows_it() -> None:
    """The folder on this machine for a viewer here, and the tree by name and commit for anyone."""
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    base = valid(sarif_log(result.violations[:1]))["runs"][0]["originalUriBaseIds"]["ROOT0"]
    text = base["description"]["text"]
    assert text.startswith("Paths are relative to ") and "overlapcheck" in text
    assert str(ROOT) not in text


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_checkout_with_a_remote_is_mapped_to_its_commit(tmp_path: Path) -> None:
    """A root inside a checkout is given relative to the checkout's top, which
    `versionControlProvenance` ties to the remote (credentials left out) and the commit."""
    top = tmp_path / "engine"
    (top / "python" / "sched").mkdir(parents=True)
    (top / "python" / "sched" / "loop.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q", str(top))
    _git(top, "add", ".")
    _git(top, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    _git(top, "remote", "add", "origin", "https://someone:secret@example.com/team/engine.git")
    where = Location("write", "sched/loop.py", 1, "step", str(top / "python"))
    finding = Violation("no-race", 3, 0.0, (1,), "a race", locations=(where,))
    run = valid(sarif_log([finding]))["runs"][0]
    (provenance,) = run["versionControlProvenance"]
    assert provenance == {
        "repositoryUri": "https://example.com/team/engine.git",
        "revisionId": _git(top, "rev-parse", "HEAD"),
        "mappedTo": {"uriBaseId": "REPO0"},
    }
    bases = run["originalUriBaseIds"]
    assert bases["ROOT0"]["uri"] == "python/" and bases["ROOT0"]["uriBaseId"] == "REPO0"
    assert bases["REPO0"]["uri"] == top.resolve().as_uri() + "/"
    assert "secret" not in json.dumps(run)


def test_a_checkout_without_a_remote_has_no_provenance(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    where = Location("write", "loop.py", 1, "step", str(tmp_path))
    run = valid(sarif_log([Violation("no-race", 3, 0.0, (1,), "a race", locations=(where,))]))
    assert "versionControlProvenance" not in run["runs"][0]
    assert "commit `" in run["runs"][0]["originalUriBaseIds"]["ROOT0"]["description"]["text"]
