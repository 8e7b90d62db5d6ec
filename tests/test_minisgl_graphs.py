"""CUDA graphs in the mini-sglang adapter: upstream's `GraphRunner` pads a decode batch to a
captured size with its dummy request, and a replay is one kernel over the captured buffers; the
generator draws the switch, and scenario files carry it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, find, settings

pytest.importorskip("torch")

from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.core.trace import PAGE_TABLE
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict
from overlapcheck.scenarios.strategies import generated_scenarios
from tests.test_minisgl import needs_snapshot, unpack

SLOTS = 3


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # mini-sglang as shipped: a process imports one checkout, and other tests of this process
    # run the shipped one
    return unpack(tmp_path_factory.mktemp("minisgl"))


def _run(checkout: Path, monkeypatch: pytest.MonkeyPatch, sizes: tuple[int, ...]) -> Any:
    from overlapcheck.adapters.minisgl import make_scheduler
    from overlapcheck.backends.sim.backend import SimBackend
    from overlapcheck.harness.runner import run_scenario

    monkeypatch.setenv("MINISGL_PATH", str(checkout))
    config = SchedulerConfig(num_slots=SLOTS, num_pages=64, cuda_graph_bs=sizes)
    reqs = (
        RequestSpec(uid=0, prompt=(5, 6, 7), max_tokens=4),
        RequestSpec(uid=1, prompt=(8, 9), max_tokens=5),
    )
    return run_scenario(
        Scenario("graphs", config, reqs), SimBackend(), scheduler=make_scheduler, keep_going=True
    )


@needs_snapshot
def test_a_decode_batch_is_padded_to_the_captured_size_and_replayed_as_one_kernel(
    shipped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(shipped, monkeypatch, (4,))
    # the tokens are the reference's, and no race but bug 6's (with the fixes, none at all:
    # docs/minisgl.md)
    found = {v.invariant for v in result.violations}
    assert found <= {"no-race", "exact-length"}, result.violations
    assert all(
        "_make_write_tuple" in v.message for v in result.violations if v.invariant == "no-race"
    )
    forwards = [op for op in result.trace.ops if op.kind == "forward"]
    graphed = [op for op in forwards if op.label.endswith("(graph 4)")]
    assert graphed and all(op.label.startswith("D") for op in graphed)  # decode only
    assert not any(op.label.startswith("P") and "graph" in op.label for op in forwards)
    width = result.config.max_seq_len
    for op in graphed:
        tables = [a for a in op.accesses if a.buffer == PAGE_TABLE and a.mode == "r"]
        own, padding = tables  # the batch's rows, then the dummy request's (row SLOTS)
        assert len(op.uids) in (1, 2)
        assert set((padding.cells // width).tolist()) == {SLOTS}
        assert SLOTS not in set((own.cells // width).tolist())
        assert len(padding.cells) == 4 - len(op.uids)  # one cell per dummy row: its length is 1
    # the sampler reads the logits of the batch's own rows only
    argmax = [op for op in result.trace.ops if op.label.startswith("argmax")]
    assert len(argmax) == len(graphed)
    # without graphs: the same tokens, no padding
    plain = _run(shipped, monkeypatch, ())
    assert {v.invariant for v in plain.violations} == found
    assert not any("graph" in op.label for op in plain.trace.ops)
    assert [m.token for m in plain.trace.messages] == [m.token for m in result.trace.messages]


def test_the_generator_draws_graphs_and_shrinks_them_away() -> None:
    found = find(
        generated_scenarios(),
        lambda s: bool(s.config.cuda_graph_bs),
        settings=settings(database=None, suppress_health_check=list(HealthCheck)),
    )
    assert found.config.cuda_graph_bs
    off = find(
        generated_scenarios(),
        lambda s: True,
        settings=settings(database=None, suppress_health_check=list(HealthCheck)),
    )
    assert off.config.cuda_graph_bs == ()


def test_scenario_files_carry_the_sizes_and_reject_bad_ones() -> None:
    raw = {"config": {"cuda_graph_bs": [1, 2, 4]}, "requests": [{"uid": 0, "prompt": [5]}]}
    scenario = scenario_from_dict(raw)
    assert scenario.config.cuda_graph_bs == (1, 2, 4)
    assert scenario_from_dict(scenario.to_json()).config == scenario.config
    assert "cuda_graph_bs" not in scenario.with_config(cuda_graph_bs=()).to_json()["config"]
    with pytest.raises(ScenarioError, match="cuda_graph_bs"):
        scenario_from_dict({**raw, "config": {"cuda_graph_bs": 4}})
    with pytest.raises(ConfigError, match="cuda_graph_bs"):
        SchedulerConfig(cuda_graph_bs=(0,))
