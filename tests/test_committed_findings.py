"""The counterexamples the docs ship still reproduce with this overlapcheck: each replays to its
recorded invariant (`reproduced`: with the same trace, or another trace where overlapcheck's own
code changed since it was written, which the replay then names). A change of the simulated GPU
that loses one of them fails here, not in a user's hands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from minisgl_trees import (
    FIX_4_PR111,
    FIX_7,
    FIXES,
    PR111_FIXES,
    PR111_SNAPSHOT,
    SNAPSHOT,
    shared_tree,
    unpack,
)
from upstream_cli import run_cli

from overlapcheck.formats.counterexample import load
from overlapcheck.replay.sim import judge, replay_on_sim

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MINISGL = "overlapcheck.adapters.minisgl:make_scheduler"
PR111_FINDING = "findings/mini-sglang/pr111-abort-in-flight.json"
BUG7_FINDING = "findings/mini-sglang/bug7-admission-pages.json"
# mini-sglang's findings recorded on its tree as shipped (the GPU replay's fixed row needs a
# patched tree; PR #111's finding, its patched tree: below).
MINISGL_SHIPPED = (
    "findings/mini-sglang/bug1-finished-early.json",
    "findings/mini-sglang/bug2-token-after-eos.json",
    "findings/mini-sglang/bug3-row-freed-in-flight.json",
    "findings/mini-sglang/bug4-abort-in-flight.json",
    "findings/mini-sglang/bug4-double-free.json",
    "findings/mini-sglang/bug5-radix-stale-row.json",
    "findings/mini-sglang/bug6-write-mapping.json",
    "findings/mini-sglang/bug7-admission-pages.json",
    "gpu-replay/minisgl-record-stream.json",
)


def _counterexamples_of_the_reference() -> list[str]:
    names = []
    for path in sorted((DOCS / "gpu-replay").glob("*.json")):
        data = json.loads(path.read_text())
        spec = (data.get("scheduler") or {}).get("spec", "reference")
        if data.get("format") == "overlapcheck-counterexample" and spec == "reference":
            names.append(str(path.relative_to(DOCS)))
    return names


def _reproduces(name: str) -> None:
    cex = load(DOCS / name)
    verdict = judge(cex, replay_on_sim(cex))
    assert verdict.kind == "reproduced", (name, verdict)
    assert verdict.same_trace or verdict.changed, (name, verdict)


@pytest.mark.parametrize("name", _counterexamples_of_the_reference())
def test_the_reference_counterexamples_in_the_docs_reproduce(name: str) -> None:
    _reproduces(name)


@pytest.fixture(scope="module")
def minisgl_tree() -> Path:
    pytest.importorskip("torch")
    if not SNAPSHOT.is_file():
        pytest.skip(f"no mini-sglang snapshot at {SNAPSHOT}")
    return shared_tree()


@pytest.mark.parametrize("name", MINISGL_SHIPPED)
def test_the_mini_sglang_findings_in_the_docs_reproduce_on_its_tree_as_shipped(
    name: str, minisgl_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load(DOCS / name).scheduler.text == MINISGL
    monkeypatch.setenv("MINISGL_PATH", str(minisgl_tree))
    _reproduces(name)


# PR #111's tree with the patches of bugs 6, 1, 2 and 3 (the search that found its abort ran on
# it); mini-sglang runs in a subprocess there (one mini-sglang per process: this one has 20fcd7f).
@pytest.fixture(scope="module")
def pr111_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    if not PR111_SNAPSHOT.is_file():
        pytest.skip(f"no mini-sglang PR #111 snapshot at {PR111_SNAPSHOT}")
    return unpack(tmp_path_factory.mktemp("minisgl-pr111"), PR111_FIXES, PR111_SNAPSHOT)


def _on(tree: Path, args: list[str], cwd: Path) -> Any:
    done = run_cli("MINISGL_PATH", tree, [*args, "--json"], cwd)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads(done.stdout)


def test_pr111_s_abort_in_flight_reproduces_on_its_patched_tree(
    pr111_tree: Path, tmp_path: Path
) -> None:
    assert load(DOCS / PR111_FINDING).scheduler.text == MINISGL
    report = _on(pr111_tree, ["replay", str(DOCS / PR111_FINDING)], tmp_path)
    assert report["verdict"] == "reproduced" and report["invariant"] == "abort-silent", report
    assert report["changed_files"] == []  # the tree the search ran on, byte for byte
    assert report["same_trace_hash"] or report["changed"], report


def test_pr111_s_tree_is_clean_of_the_double_free_and_fix_4_on_top_of_it_of_the_abort(
    pr111_tree: Path, tmp_path: Path
) -> None:
    at_eos = ["run", "--scheduler", MINISGL, "--scenario"]
    at_eos += [str(DOCS / "findings/mini-sglang/abort-at-eos.json"), "--skip", "abort-silent"]
    assert _on(pr111_tree, at_eos, tmp_path)["violations"] == []
    fixed = unpack(tmp_path / "fix-4", PR111_FIXES + FIX_4_PR111, PR111_SNAPSHOT)
    report = _on(fixed, ["replay", str(DOCS / PR111_FINDING)], tmp_path)
    assert report["verdict"] == "fixed" and report["violations"] == [], report


# Find, fix, confirm for bug 7: the counterexample was recorded on the tree with the overlap
# bugs' patches; with FIX_7 (whole pages counted at admission) on top, the replay says fixed,
# naming the one file the patch changed.
def test_bug_7_s_admission_replays_fixed_with_fix_7(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if not SNAPSHOT.is_file():
        pytest.skip(f"no mini-sglang snapshot at {SNAPSHOT}")
    assert load(DOCS / BUG7_FINDING).scheduler.text == MINISGL
    fixed = unpack(tmp_path / "fix-7", FIXES + FIX_7)
    done = run_cli("MINISGL_PATH", fixed, ["replay", str(DOCS / BUG7_FINDING), "--json"], tmp_path)
    report = json.loads(done.stdout)
    assert (done.returncode, report["verdict"], report["violations"]) == (0, "fixed", []), report
    assert report["changed_files"] == ["python/minisgl/scheduler/prefill.py"]
