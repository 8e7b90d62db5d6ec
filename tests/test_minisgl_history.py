"""mini-sglang's older API, as its history had it: the adapter checks any commit by what the
checkout has (`adapters/minisgl/checkout.Features`), not only the one its API was written on.
The older trees are emulated from the 20fcd7f snapshot by the edits that undo a feature's
arrival: request cancellation (578df98), pages of more than one token (5e52ef3), the capture
buffer of its CUDA graphs (1961602)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from minisgl_trees import FIXES, SNAPSHOT, shared_tree, unpack
from upstream_cli import run_cli

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not SNAPSHOT.is_file(), reason=f"no mini-sglang snapshot at {SNAPSHOT}"
)
SPEC = "overlapcheck.adapters.minisgl:make_scheduler"

# uid 0 aborted while it decodes, then used again
ABORT_AND_REUSE = {
    "name": "abort-and-reuse",
    "config": {"num_slots": 2, "num_pages": 40, "page_size": 1, "max_seq_len": 48},
    "requests": [
        {"uid": 0, "prompt": [3, 4], "max_tokens": 12, "abort_iteration": 3},
        {"uid": 0, "prompt": [5], "max_tokens": 4, "arrival_iteration": 4},
        {"uid": 1, "prompt": [6, 7, 8], "max_tokens": 5},
    ],
}


def _without_cancellation(root: Path) -> Path:
    """The tree as before 578df98 as far as the adapter can tell: no `AbortBackendMsg`."""
    for path in (root / "python/minisgl").rglob("*.py"):
        text = path.read_text()
        if "AbortBackendMsg" in text:
            path.write_text(text.replace("AbortBackendMsg", "OlderNameOfAbortMsg"))
    return root


def test_without_upstream_cancellation_an_abort_asked_for_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    tree = _without_cancellation(unpack(tmp_path, FIXES))
    scenario = tmp_path / "abort.json"
    scenario.write_text(json.dumps(ABORT_AND_REUSE))
    args = ["run", "--scheduler", SPEC, "--scenario", str(scenario)]
    done = run_cli("MINISGL_PATH", tree, args, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "cannot cancel a request" in line and "578df98" in line


def test_a_search_of_a_checkout_without_cancellation_draws_no_abort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a search draws goes through `SchedulerSpec.fit` (tests/test_scenario_fitting.py):
    for such a checkout, the workload without its aborts, the rest as drawn."""
    from overlapcheck.adapters.minisgl import adapter
    from overlapcheck.adapters.minisgl.checkout import Features
    from overlapcheck.harness.scheduler_spec import SchedulerSpec
    from overlapcheck.scenarios.loader import scenario_from_dict

    monkeypatch.setenv("MINISGL_PATH", str(shared_tree()))
    older = Features(
        paged=True, cancels=False, graphs=True, capture_buffer=True, defers_frees=False
    )
    monkeypatch.setattr(adapter, "_checkout_features", lambda: older)
    drawn = scenario_from_dict(ABORT_AND_REUSE)
    assert any(r.abort_iteration is not None for r in drawn.requests)
    fitted = SchedulerSpec.of(adapter.make_scheduler).fit(drawn)
    aborts = [(r.abort_at, r.abort_iteration, r.abort_after) for r in fitted.requests]
    assert aborts == [(None, None, None)] * len(drawn.requests)
    assert [r.prompt for r in fitted.requests] == [r.prompt for r in drawn.requests]
    assert fitted.config == drawn.config


def test_an_older_checkout_runs_the_nearest_configuration_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from overlapcheck.adapters.minisgl import adapter
    from overlapcheck.adapters.minisgl.checkout import Features
    from overlapcheck.backends.sim.backend import SimBackend
    from overlapcheck.core.errors import UserError
    from overlapcheck.harness.runner import run_scenario
    from overlapcheck.scenarios.named import named_scenario

    monkeypatch.setenv("MINISGL_PATH", str(shared_tree()))
    older = Features(
        paged=False, cancels=True, graphs=False, capture_buffer=False, defers_frees=False
    )
    monkeypatch.setattr(adapter, "_checkout_features", lambda: older)
    paged = named_scenario("basic").with_config(page_size=4, num_pages=8, cuda_graph_bs=(1, 2))
    fitted = adapter.fit_scenario(paged).config
    assert (fitted.page_size, fitted.num_pages, fitted.cuda_graph_bs) == (1, 32, ())
    with pytest.raises(UserError) as err:
        run_scenario(paged, SimBackend(), scheduler=adapter.make_scheduler)
    line = str(err.value)
    assert "\n" not in line and "page_size=4" in line and "5e52ef3" in line
    assert "cuda_graph_bs" in line and "f074873" in line
    current = Features(
        paged=True, cancels=True, graphs=True, capture_buffer=True, defers_frees=False
    )
    monkeypatch.setattr(adapter, "_checkout_features", lambda: current)
    assert adapter.fit_scenario(paged) is paged


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MINISGL_REPO"), reason="MINISGL_REPO names no git clone of mini-sglang"
)
@pytest.mark.parametrize("commit", ["ef4367f", "0e5f1e7"])
def test_a_fix_of_mini_sglangs_history_is_found_on_its_parent_and_replays_fixed(
    commit: str,
) -> None:
    """`bench/minisgl_history.py` for one fix: the race in chunked prefill (ef4367f) and the
    token pool read under CUDA-graph padding (0e5f1e7), from a real clone of mini-sglang."""
    from overlapcheck.bench.minisgl_history import HISTORY, measure

    (fix,) = [f for f in HISTORY if f.commit == commit]
    outcome = measure(Path(os.environ["MINISGL_REPO"]), fix, budget=200, seed=0)
    assert outcome.found.startswith("VIOLATION"), outcome.found
    assert outcome.replay.startswith("fixed:"), outcome.replay
