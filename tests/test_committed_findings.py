"""The counterexamples the docs ship still reproduce with this overlapcheck: each replays to its
recorded invariant (`reproduced`: with the same trace, or another trace where overlapcheck's own
code changed since it was written, which the replay then names). A change of the simulated GPU
that loses one of them fails here, not in a user's hands."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from overlapcheck.formats.counterexample import load
from overlapcheck.replay.sim import judge, replay_on_sim

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MINISGL = "overlapcheck.adapters.minisgl:make_scheduler"
SNAPSHOT = Path(
    os.environ.get("MINISGL_SNAPSHOT", ROOT.parent / "shared/upstream/mini-sglang-20fcd7f.tar.gz")
)
# mini-sglang's findings recorded on its tree as shipped (the others need a patched tree: the GPU
# replay's fixed row and PR #111's, saved on the trees their searches ran on).
MINISGL_SHIPPED = (
    "findings/mini-sglang/bug1-finished-early.json",
    "findings/mini-sglang/bug2-token-after-eos.json",
    "findings/mini-sglang/bug3-row-freed-in-flight.json",
    "findings/mini-sglang/bug4-abort-in-flight.json",
    "findings/mini-sglang/bug4-double-free.json",
    "findings/mini-sglang/bug5-radix-stale-row.json",
    "findings/mini-sglang/bug6-write-mapping.json",
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
def minisgl_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    if not SNAPSHOT.is_file():
        pytest.skip(f"no mini-sglang snapshot at {SNAPSHOT}")
    into = tmp_path_factory.mktemp("minisgl-findings")
    with tarfile.open(SNAPSHOT) as tar:
        tar.extractall(into, filter="data")
    (root,) = into.iterdir()
    return root


@pytest.mark.parametrize("name", MINISGL_SHIPPED)
def test_the_mini_sglang_findings_in_the_docs_reproduce_on_its_tree_as_shipped(
    name: str, minisgl_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load(DOCS / name).scheduler.text == MINISGL
    monkeypatch.setenv("MINISGL_PATH", str(minisgl_tree))
    _reproduces(name)
