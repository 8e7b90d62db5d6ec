"""`bench --reliability --mode`: the fixed scheduler over generated examples in each preemption
mode, and a violating example saved so that it replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import SeededDelay, Timing
from overlapcheck.bench.fixed_clean import save
from overlapcheck.bench.generated import Example
from overlapcheck.bench.preemption_modes import MODES, NAMES, parse_modes
from overlapcheck.cli import main
from overlapcheck.core.errors import UserError
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import run_scenario
from overlapcheck.replay.sim import replay_on_sim
from overlapcheck.scenarios.named import named_scenario


def test_every_mode_is_named_once_and_pins_a_valid_config() -> None:
    assert NAMES == (
        "none",
        "recompute/allocation-failure",
        "recompute/retract-decode",
        "swap/allocation-failure",
        "swap/retract-decode",
    )
    assert parse_modes(["all"]) == list(MODES)
    assert parse_modes(["swap/retract-decode", "none", "none"]) == [MODES[0], MODES[4]]
    with pytest.raises(UserError, match="--mode swap: not a preemption mode"):
        parse_modes(["swap"])
    speculative = named_scenario("speculative")
    for mode in MODES:
        config = mode.pin(speculative).config
        assert (config.preemption, config.preempt_policy if mode.preemption != "none" else "-") == (
            mode.preemption,
            mode.policy if mode.preemption != "none" else "-",
        )
        assert config.page_alloc == ("reserve" if mode.preemption == "none" else "on-demand")
        assert config.draft_tokens == speculative.config.draft_tokens  # speculation stays


def test_each_mode_runs_its_examples_and_reports_its_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--reliability", "--examples", "6", "--replays", "0", "--workers", "1"]
    modes = ["--mode", "none", "--mode", "swap/retract-decode"]
    rc = main([*argv, *modes, "--out", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads(captured.out)["reliability"]
    assert [m["mode"] for m in report["modes"]] == ["none", "swap/retract-decode"]
    assert all(m["examples"] == 6 and m["violations"] == 0 for m in report["modes"])
    assert all(m["examples_per_second"] > 0 for m in report["modes"])
    assert report["examples"] == 12 and report["ok"] and report["replays"] == 0
    # Every example of the pinned mode ran in it.
    assert report["kinds"]["preemption-swap"] == 6 and "preemption-recompute" not in report["kinds"]
    assert "swap/retract-decode: 6 examples (" in captured.err
    assert "examples/s: 0 violation(s)" in captured.err
    assert "replays: none asked" in captured.err


def test_speculation_runs_in_a_preemption_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--reliability", "--speculative", "--mode", "recompute/allocation-failure"]
    rest = ["--examples", "6", "--replays", "0", "--workers", "1", "--out", str(tmp_path)]
    assert main([*argv, *rest, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["reliability"]
    assert report["kinds"]["speculative+preemption-recompute"] == 6 and report["ok"]


def test_a_violating_example_is_saved_and_replays(tmp_path: Path) -> None:
    scenario = named_scenario("preemption").with_config(
        preemption="recompute",
        page_alloc="on-demand",
        preempt_policy="retract-decode",
        faults=frozenset(["retract-skips-inflight"]),
    )
    timing = Timing(source=SeededDelay(3))
    result = run_scenario(scenario, SimBackend(timing))
    assert result.violations
    path = save(Example(result, timing), tmp_path)
    assert path.name.startswith(counterexample.UNSHRUNK)
    cex = counterexample.load(path)
    replayed = replay_on_sim(cex)
    assert cex.reproduced(replayed) is not None
    assert replayed.trace_hash == result.trace_hash == cex.trace_hash
