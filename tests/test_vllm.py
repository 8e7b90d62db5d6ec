"""vLLM's own v1 scheduler, unmodified, under the simulated CUDA: against the 0.34.0 source snapshot
(`../shared/upstream/vllm-0.34.0-src.tar.gz`, or `VLLM_SNAPSHOT`), unpacked per test run.

vLLM is imported once per test process (module-scoped fixture): the fast tests run named
scenarios in this process. An edited copy of the tree runs in a subprocess (one vLLM per
process); those, and the searches, are `slow`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from upstream_cli import run_cli

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(
    os.environ.get("VLLM_SNAPSHOT", ROOT.parent / "shared/upstream/vllm-0.34.0-src.tar.gz")
)
SPEC = "overlapcheck.adapters.vllm:make_scheduler"
CONNECTOR = "overlapcheck.adapters.vllm:make_connector_scheduler"
SCHEDULER_PY = "vllm/v1/core/sched/scheduler.py"
needs_snapshot = pytest.mark.skipif(
    not SNAPSHOT.is_file(), reason=f"no vLLM snapshot at {SNAPSHOT}"
)


def _vllm_deps() -> bool:
    # (found, not imported: xgrammar imports `vllm` when it can, and under pytest a checkout
    # folder named `vllm` would be that)
    return all(importlib.util.find_spec(m) for m in ("msgspec", "transformers", "xgrammar", "zmq"))


needs_deps = pytest.mark.skipif(
    not _vllm_deps(), reason="vLLM's packages are not installed (pip install 'overlapcheck[vllm]')"
)

# The deferred-free fence removed: a finished request's blocks go back to the pool at once.
NO_FENCE = (
    "        return not self.defer_block_free or (\n"
    "            request.last_sched_seq <= self.processed_step_seq\n"
    "        )",
    "        return True",
)


def unpack(into: Path, edits: Sequence[tuple[str, ...]] = ()) -> Path:
    """The snapshot unpacked into `into`, with edits applied: (old, new) in scheduler.py, or
    (file, old, new) with the file relative to the tree's root."""
    with tarfile.open(SNAPSHOT) as tar:
        tar.extractall(into, filter="data")
    root = into / "vllm-0.34.0"
    for edit in edits:
        name, old, new = edit if len(edit) == 3 else (SCHEDULER_PY, *edit)
        path = root / name
        text = path.read_text()
        assert text.count(old) == 1, old
        path.write_text(text.replace(old, new))
    return root


def overlapcheck(args: list[str], tree: Path | str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("VLLM_PATH", tree, args, cwd, timeout=900)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = unpack(tmp_path_factory.mktemp("vllm"))
    # A checkout folder named `vllm` is a package pytest may have imported under that name
    # (the repository root is overlapcheck's package): it is not vLLM.
    mine = sys.modules.get("vllm")
    if mine is not None and Path(getattr(mine, "__file__", "") or "").parent == ROOT:
        del sys.modules["vllm"]
    before = os.environ.get("VLLM_PATH")
    os.environ["VLLM_PATH"] = str(root)
    yield root
    if before is None:
        os.environ.pop("VLLM_PATH", None)
    else:
        os.environ["VLLM_PATH"] = before


def test_a_wrong_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from overlapcheck.adapters.vllm.upstream import load_vllm
    from overlapcheck.core.errors import UserError

    monkeypatch.setenv("VLLM_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="is not a vLLM tree") as err:
        load_vllm()
    assert "\n" not in str(err.value) and "VLLM_PATH" in str(err.value)


def test_the_synchronous_scheduler_asks_for_the_normal_loop() -> None:
    from overlapcheck.adapters.vllm import make_sync_scheduler
    from overlapcheck.backends.sim.backend import SimBackend
    from overlapcheck.core.errors import UserError
    from overlapcheck.harness.runner import run_scenario
    from overlapcheck.scenarios.named import named_scenario

    scenario = named_scenario("basic").with_config(loop="overlap")
    with pytest.raises(UserError, match="--loop normal"):
        run_scenario(scenario, SimBackend(), scheduler=make_sync_scheduler)


def _run(name: str, factory: str, checks: list[str] | None = None, **config: object) -> object:
    import overlapcheck.adapters.vllm as adapters
    from overlapcheck.backends.sim.backend import SimBackend
    from overlapcheck.harness.runner import run_scenario
    from overlapcheck.scenarios.named import named_scenario

    scenario = named_scenario(name)
    if config:
        scenario = scenario.with_config(**config)
    return run_scenario(
        scenario, SimBackend(), checks, scheduler=getattr(adapters, factory), keep_going=True
    )


@needs_snapshot
@needs_deps
def test_the_async_scheduler_runs_clean_with_the_worker_s_streams(tree: Path) -> None:
    result: object = _run("shared-prefix", "make_scheduler")
    assert result.violations == [], result.violations  # type: ignore[attr-defined]
    ops = result.trace.ops  # type: ignore[attr-defined]
    assert {"engine", "copy", "host"} <= {op.agent for op in ops}
    assert {"forward", "h2d", "d2h", "kernel", "host_wait", "span", "read_output"} <= {
        op.kind for op in ops
    }
    # two steps in flight: a forward launched before the previous one's output was read
    order = [op.kind for op in ops if op.kind in ("forward", "read_output")]
    assert "forward,forward" in ",".join(order)


@needs_snapshot
@needs_deps
def test_the_synchronous_scheduler_preempts_and_recomputes_clean(tree: Path) -> None:
    result: object = _run("preemption", "make_sync_scheduler", loop="normal")
    assert result.violations == [], result.violations  # type: ignore[attr-defined]
    order = [op.kind for op in result.trace.ops if op.kind in ("forward", "read_output")]  # type: ignore[attr-defined]
    assert "forward,forward" not in ",".join(order)


@needs_snapshot
@needs_deps
def test_the_connector_loads_on_the_transfer_stream_and_the_fence_keeps_it_clean(
    tree: Path,
) -> None:
    result: object = _run("memory-pressure", "make_connector_scheduler")
    assert result.violations == [], result.violations  # type: ignore[attr-defined]
    loads = [op for op in result.trace.ops if op.agent == "transfer" and op.kind == "kernel"]  # type: ignore[attr-defined]
    assert loads and all(a.buffer == "kv" for op in loads for a in op.accesses if a.mode == "w")


@needs_snapshot
@needs_deps
def test_ngram_drafts_verify_on_the_worker_and_outputs_match(tree: Path) -> None:
    # every default check, work-bound too: a forward's drafts are judged by its input's end
    result: object = _run("speculative", "make_ngram_scheduler")
    assert result.violations == [], result.violations  # type: ignore[attr-defined]
    forwards = [op for op in result.trace.ops if op.kind == "forward"]  # type: ignore[attr-defined]
    assert all(op.drafts is not None for op in forwards)
    assert any(op.drafts.any() for op in forwards)
    # some step emitted more than one token for a request: a draft was accepted
    multi = [
        op
        for op in result.trace.ops  # type: ignore[attr-defined]
        if op.kind == "forward"
        for a in op.accesses
        if a.buffer == "token_pool" and a.mode == "w" and len(a.cells) > len(op.uids)
    ]
    assert multi


@needs_snapshot
@needs_deps
def test_work_bound_judges_every_position_of_a_forward_whose_drafts_are_not_said(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same run with the forwards' drafts hidden: each position counts as an input, and
    # vLLM's full draft sets verified one token from max_tokens are work past it.
    from overlapcheck.backends.torchsim.session import SimulatedCuda

    real = SimulatedCuda.launch

    def hidden(self: SimulatedCuda, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **{**kwargs, "drafts": None})

    monkeypatch.setattr(SimulatedCuda, "launch", hidden)
    result: object = _run("speculative", "make_ngram_scheduler", ["work-bound"])
    found = result.violations  # type: ignore[attr-defined]
    assert found and found[0].invariant == "work-bound" and "needs only" in found[0].message


@needs_snapshot
@pytest.mark.slow
def test_without_the_fence_the_connector_mode_races_with_the_step_in_flight(
    tmp_path: Path,
) -> None:
    out = tmp_path / "cx"
    search = ["explore", "--scheduler", CONNECTOR, "--workers", "1", "--budget", "600"]
    done = overlapcheck([*search, "--out", str(out)], unpack(tmp_path, [NO_FENCE]), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    found = sorted(p for p in out.glob("no-race-*.json") if "perfetto" not in p.name)
    assert found, done.stdout
    saved = json.loads(found[0].read_text())
    message = saved["violation"]["message"]
    assert "WAW on kv cells" in message and "_start_load" in message and "transfer" in message
    replay = overlapcheck(["replay", str(found[0])], tmp_path / "vllm-0.34.0", tmp_path)
    assert replay.returncode == 1 and "identical" in replay.stdout, replay.stdout
    # (`timeline` takes its output with -o: a run without it was a usage error, exit 2)
    drawn = tmp_path / "t.json"
    done = overlapcheck(
        ["timeline", str(found[0]), "-o", str(drawn)], tmp_path / "vllm-0.34.0", tmp_path
    )
    assert done.returncode == 0, done.stderr
    events = json.loads(drawn.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    lanes = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "transfer stream" in lanes, lanes  # the connector's loads, where the race is


@needs_snapshot
@pytest.mark.slow
def test_with_the_fence_a_connector_search_finds_nothing(tmp_path: Path) -> None:
    search = ["explore", "--scheduler", CONNECTOR, "--workers", "1", "--max-examples", "150"]
    done = overlapcheck(
        [*search, "--budget", "600", "--out", str(tmp_path / "cx")], unpack(tmp_path), tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_snapshot
@pytest.mark.slow
def test_an_exception_inside_vllm_is_a_no_crash_finding_naming_its_line(tmp_path: Path) -> None:
    root = unpack(tmp_path)
    path = root / SCHEDULER_PY
    text = path.read_text()
    marker = "    def update_from_output(\n"
    at = text.index(marker)
    body = text.index("        sampled_token_ids = model_runner_output.sampled_token_ids\n", at)
    text = text[:body] + '        raise RuntimeError("boom")\n' + text[body:]
    path.write_text(text)
    line = text[:body].count("\n") + 1
    done = overlapcheck(["run", "--scheduler", SPEC], root, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no-crash" in done.stdout and f"scheduler.py:{line}" in done.stdout, done.stdout


@needs_snapshot
@pytest.mark.slow
def test_an_api_the_adapter_does_not_know_is_one_line_and_exit_2(tmp_path: Path) -> None:
    renamed = (
        "vllm/v1/core/sched/async_scheduler.py",
        "class AsyncScheduler(Scheduler):",
        "class OverlapScheduler(Scheduler):",
    )
    done = overlapcheck(["run", "--scheduler", SPEC], unpack(tmp_path, [renamed]), tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "incompatible" in lines[0] and "AsyncScheduler" in lines[0]


@needs_snapshot
@pytest.mark.slow
def test_the_same_trace_hash_in_two_processes(tmp_path: Path) -> None:
    root = unpack(tmp_path)
    hashes = []
    for _ in range(2):
        done = overlapcheck(
            ["run", "--scheduler", CONNECTOR, "--scenario", "memory-pressure"], root, tmp_path
        )
        assert done.returncode == 0, done.stdout + done.stderr
        hashes.append(re.findall(r"trace ([0-9a-f]{16})", done.stdout))
    assert hashes[0] and hashes[0] == hashes[1]


# Upstream bugs the searches find (bench/upstream_mutants.py): each re-introduced into a copy of
# the tree, found by its factory's search, and its counterexample `fixed` on the clean tree.
FOUND_UPSTREAM = {
    "max-tokens-extra-step": "work-bound",
    "preempt-stale-output": "oracle",
    "rejected-drafts-placeholders": "oracle",
    "spec-pad-past-max-model-len": "no-crash",
}


@needs_snapshot
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FOUND_UPSTREAM))
def test_an_upstream_bug_re_introduced_is_found_and_its_fix_confirmed(
    tmp_path: Path, name: str
) -> None:
    from overlapcheck.bench.upstream_mutants import BY_NAME, apply

    clean = unpack(tmp_path / "clean")
    mutant = BY_NAME[name]
    out = tmp_path / "cx"
    search = ["explore", "--scheduler", f"overlapcheck.adapters.vllm:{mutant.factory}"]
    search += [*mutant.args, "--workers", "1", "--budget", "600", "--out", str(out)]
    done = overlapcheck(search, apply(clean, mutant, tmp_path / "mutants"), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    found = sorted(
        p for p in out.glob(f"{FOUND_UPSTREAM[name]}-*.json") if "perfetto" not in p.name
    )
    assert found, done.stdout
    replay = overlapcheck(["replay", str(found[0])], clean, tmp_path)
    assert replay.returncode == 0 and "fixed" in replay.stdout, replay.stdout


# A prompt sent twice at the end of its row (page size 1, prefix cache, k = 3): the second is
# admitted one token from its end and padded to 1 + k (bench/upstream_mutants.py, #53962).
ROW_END = """
import json
import overlapcheck.adapters.vllm as adapters
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import run_scenario

config = SchedulerConfig(
    page_size=1, max_seq_len=16, num_pages=64, num_slots=4, max_extend_tokens=32,
    draft_tokens=3, cache="radix",
)
prompt = tuple(range(10, 24))
requests = (
    RequestSpec(0, prompt, max_tokens=1),
    RequestSpec(1, prompt, max_tokens=2, arrival=0.01),
)
result = run_scenario(
    Scenario("row-end", config, requests), SimBackend(),
    scheduler=adapters.make_ngram_scheduler, keep_going=True,
)
print(json.dumps([[v.invariant, v.message] for v in result.violations]))
"""


@needs_snapshot
@pytest.mark.slow
def test_a_step_scheduled_past_max_model_len_is_a_finding(tmp_path: Path) -> None:
    from overlapcheck.bench.upstream_mutants import BY_NAME, apply

    clean = unpack(tmp_path / "clean")
    mutant = apply(clean, BY_NAME["spec-pad-past-max-model-len"], tmp_path / "mutants")
    seen: dict[str, list[list[str]]] = {}
    for name, root in (("mutant", mutant), ("clean", clean)):
        done = subprocess.run(
            [sys.executable, "-c", ROW_END],
            env={**os.environ, "VLLM_PATH": str(root)},
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        seen[name] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["clean"] == []
    [(invariant, message)] = seen["mutant"]
    assert invariant == "no-crash" and "past max_model_len 16" in message, message
