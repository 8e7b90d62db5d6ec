"""`explore --ray`: the search streams as Ray tasks, on a real local Ray instance (not a mock);
`replay --ray` spreads a device replay's repeats (the plumbing, on the CPU backend's split).
Skipped where Ray is not installed (`pip install -e '.[cluster]'`; CI installs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlapcheck.core.errors import UserError
from overlapcheck.explore.parallel import Listener
from overlapcheck.explore.ray_search import connected, search_ray
from overlapcheck.explore.search import SearchSpec
from overlapcheck.formats import counterexample
from overlapcheck.replay.ray import split
from overlapcheck.replay.sim import replay_on_sim

pytest.importorskip("ray")  # explore/ray_search.py imports Ray only when it runs


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck.cli", *args], capture_output=True, text=True
    )


def test_a_local_ray_instance_finds_a_named_fault_and_saves_it(tmp_path: Path) -> None:
    out = tmp_path / "cex"
    proc = cli(
        "explore",
        "--fault",
        "free-slot-early",
        "--ray",
        "local",
        "--workers",
        "2",
        "--budget",
        "60",
        "--out",
        str(out),
        "--no-timeline",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ray: 2 search streams on a local Ray instance" in proc.stderr
    (path,) = out.glob("*.json")  # the driver saved it (the unshrunk one is gone)
    assert not path.name.startswith(counterexample.UNSHRUNK)
    cex = counterexample.load(path)
    assert cex.reproduced(replay_on_sim(cex)) is not None
    replay = cli("replay", str(path), "--json")
    assert replay.returncode == 1 and json.loads(replay.stdout)["same_trace_hash"]


def test_search_ray_collects_stats_and_the_counterexample_in_the_driver() -> None:
    spec = SearchSpec(faults=frozenset(["copy-done-wrong-stream"]), budget=3600, seed=0)
    unshrunk: list[dict[str, object]] = []
    outcome = search_ray(spec, "local", 2, Listener(unshrunk=unshrunk.append))
    assert outcome.found is not None and outcome.found.invariant == "no-race"
    assert len(unshrunk) == 1 and outcome.stats.examples >= 1 and not outcome.deaths


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("127.0.0.1:1", "cannot reach the Ray cluster"),
        ("nonsense", "expected local, auto, HOST:PORT"),
        ("127.0.0.1:port", "is not a number"),
    ],
)
def test_a_bad_ray_address_is_one_line_and_exit_2(address: str, needle: str) -> None:
    proc = cli("explore", "--ray", address, "--budget", "5")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_connected_raises_a_user_error_for_an_unreachable_address() -> None:
    with pytest.raises(UserError, match="cannot reach"), connected("127.0.0.1:1"):
        pass


def test_replay_repeats_split_evenly_over_engines() -> None:
    assert split(10, 4) == [3, 3, 2, 2]
    assert split(2, 8) == [1, 1]  # never an engine with nothing to do
    assert split(5, 1) == [5]


@pytest.mark.slow  # a minute: Ray engines in processes of their own, each loading the model
def test_replay_spreads_device_repeats_over_ray_engines(tmp_path: Path) -> None:
    """The `replay --backend cuda --ray` path, run with the CPU engine: two tasks, one engine
    each, verdicts collected per repeat with the engine that ran them."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    found = cli(
        "explore",
        "--fault",
        "free-slot-early",
        "--workers",
        "1",
        "--budget",
        "60",
        "--out",
        str(tmp_path),
        "--no-timeline",
    )
    assert found.returncode == 1, found.stderr
    (path,) = tmp_path.glob("*.json")
    proc = cli("replay", str(path), "--backend", "cpu", "--repeat", "2", "--ray", "local", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    assert data["engines"] == 2 and data["repeats"] == 2
    assert sorted(v["engine"] for v in data["verdicts"]) == [0, 1]
