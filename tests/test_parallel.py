"""`explore --workers N`: search streams in processes over one example database. The first
violation stops the other streams and its shrunk counterexample replays; a stream that dies is
reported in one line and the others carry on; the unshrunk failure is on disk before shrinking."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from overlapcheck.explore.parallel import (
    Listener,
    Live,
    ProcessPool,
    drive,
    search_processes,
    search_streams,
    shared_database,
)
from overlapcheck.explore.search import SearchSpec, stream_seed
from overlapcheck.formats import counterexample
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.replay.sim import replay_on_sim


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck.cli", *args], capture_output=True, text=True
    )


def test_streams_get_their_own_seeds_and_a_share_of_the_examples() -> None:
    spec = SearchSpec(seed=7, max_examples=10)
    streams = [spec.stream(i, 3) for i in range(3)]
    assert streams[0].seed == 7  # one stream searches exactly as one process does
    assert len({s.seed for s in streams}) == 3
    assert sum(s.max_examples for s in streams) == 10
    assert stream_seed(7, 1) != stream_seed(8, 1)


def test_the_first_violation_stops_the_others_and_its_counterexample_replays(
    tmp_path: Path,
) -> None:
    spec = SearchSpec(faults=frozenset(["chunk-sample-overwrite"]), budget=3600, seed=1)
    unshrunk: list[Counterexample] = []
    outcome = search_processes(spec, 2, Listener(unshrunk=unshrunk.append))
    assert outcome.found is not None and outcome.winner in (0, 1)
    assert not outcome.deaths
    # The other stream stopped at the first violation, not at the end of its examples.
    assert outcome.stats.examples < spec.max_examples
    assert len(unshrunk) == 1 and unshrunk[0].invariant == outcome.found.invariant
    path = outcome.found.save(tmp_path)
    cex = counterexample.load(path)
    replayed = replay_on_sim(cex)
    assert cex.reproduced(replayed) is not None
    assert replayed.trace_hash == cex.trace_hash  # the same trace in this process as in a worker


def test_a_killed_worker_is_reported_and_the_others_carry_on() -> None:
    # Bounded by examples: progress (and so the kill) comes after a round, however loaded the
    # machine is, and worker 0 then searches on to the end of its share.
    spec = SearchSpec(budget=3600, max_examples=60, seed=2, round_size=5)
    notices: list[str] = []
    with shared_database(spec) as shared:
        pool = ProcessPool(shared, 2)
        killed: list[int] = []

        def on_progress(live: Live) -> None:
            if not killed and live.examples > 0 and pool.procs[1].is_alive():
                killed.append(live.examples)
                os.kill(pool.procs[1].pid or 0, signal.SIGKILL)

        outcome = drive(pool, shared, Listener(progress=on_progress, notice=notices.append))
    assert killed
    assert outcome.found is None
    assert len(outcome.deaths) == 1 and notices == outcome.deaths
    assert outcome.deaths[0].startswith("worker 1 died (killed by SIGKILL)")
    assert "1 of 2 still running" in outcome.deaths[0]
    # worker 0 searched on, to the end of its share
    assert outcome.stats.examples > killed[0]


def test_one_worker_searches_in_this_process() -> None:
    spec = SearchSpec(faults=frozenset(["copy-done-wrong-stream"]), budget=3600, seed=0)
    outcome = search_streams(spec, 1)
    assert outcome.found is not None and outcome.unshrunk is not None and outcome.winner == 0
    assert outcome.stats.first_failure is not None


def test_explore_workers_saves_one_shrunk_counterexample_that_replays(tmp_path: Path) -> None:
    out = tmp_path / "cex"
    proc = cli(
        "explore",
        "--fault",
        "chunk-sample-overwrite",
        "--workers",
        "2",
        "--budget",
        "60",
        "--out",
        str(out),
        "--db",
        str(tmp_path / "db"),
        "--no-timeline",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "saved before shrinking: " in proc.stderr
    assert "examples, " in proc.stdout and "scheduler iterations simulated, " in proc.stdout
    (path,) = out.glob("*.json")  # the unshrunk file was replaced by the shrunk one
    assert not path.name.startswith(counterexample.UNSHRUNK)
    assert any((tmp_path / "db").iterdir())  # the shared database holds what the streams saw
    replay = cli("replay", str(path), "--json")
    assert replay.returncode == 1
    assert json.loads(replay.stdout)["same_trace_hash"]


def test_the_unshrunk_counterexample_is_on_disk_before_shrinking(tmp_path: Path) -> None:
    """What a kill during shrinking leaves behind: a counterexample that replays."""
    spec = SearchSpec(faults=frozenset(["staging-buffer-reuse"]), budget=3600, seed=0)
    seen: list[Path] = []

    def on_unshrunk(found: Counterexample) -> None:
        seen.append(found.save(tmp_path, unshrunk=True))

    outcome = search_streams(spec, 1, Listener(unshrunk=on_unshrunk))
    assert outcome.found is not None and len(seen) == 1
    assert seen[0].name.startswith(counterexample.UNSHRUNK)
    cex = counterexample.load(seen[0])
    assert cex.reproduced(replay_on_sim(cex)) is not None


def test_the_default_path_never_imports_ray(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from overlapcheck.cli import main\n"
        "if __name__ == '__main__':\n"
        f"    rc = main(['explore', '--budget', '1', '--workers', '2', '--out', {str(tmp_path)!r}])"
        "\n"
        "    assert rc == 0, rc\n"
        "    assert 'ray' not in sys.modules\n"
    )
    # A file with a main guard, as multiprocessing wants: workers re-import the main module.
    script = tmp_path / "no_ray.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
