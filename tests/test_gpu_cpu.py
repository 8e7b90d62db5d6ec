"""The real engine on CPU (float32): the same scheduler drives a real transformer over the paged KV
pool, and its tokens equal Hugging Face greedy exactly, with every invariant on."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from engine_cases import MATRIX, matrix_scenario, ok

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from overlapcheck.backends.gates import Gate  # noqa: E402
from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend  # noqa: E402
from overlapcheck.backends.gpu.sampling import sample  # noqa: E402
from overlapcheck.backends.gpu.weights import (  # noqa: E402
    ModelSpec,
    preset_config,
    random_weights,
    save_checkpoint,
)
from overlapcheck.backends.sim.backend import SimBackend  # noqa: E402
from overlapcheck.cli import main as cli_main  # noqa: E402
from overlapcheck.core.errors import UserError  # noqa: E402
from overlapcheck.core.messages import SamplingParams  # noqa: E402
from overlapcheck.core.scenario import RequestSpec, Scenario  # noqa: E402
from overlapcheck.harness.runner import RunResult, run_scenario  # noqa: E402
from overlapcheck.harness.scheduler_spec import SchedulerSpec  # noqa: E402
from overlapcheck.scenarios.named import NAMED, named_scenario  # noqa: E402


@pytest.fixture(scope="module")
def cpu() -> Iterator[TorchBackend]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend (20x slower on a busy box)
    yield make_torch_backend("cpu", preset="tiny")
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("loop", "cache", "page_size"), MATRIX)
def test_matrix_tokens_equal_hf_greedy(
    cpu: TorchBackend, loop: str, cache: str, page_size: int
) -> None:
    scenario = matrix_scenario(loop, cache, page_size)
    result = run_scenario(scenario, cpu)
    ok(result)  # every invariant: oracle (= HF greedy), no-race over real footprints, pages, slots
    assert cpu.oracle is not None
    for outcome, spec in zip(result.outcomes, result.scenario.requests, strict=True):
        assert outcome.finish_reason in ("length", "eos")
        reference = cpu.oracle.greedy(spec.prompt, spec.max_tokens)
        assert outcome.tokens == reference[: len(outcome.tokens)]
        assert len(set(reference)) > 1  # the random weights really vary
    assert sum(op.kind == "forward" for op in result.trace.ops) > len(scenario.requests)


@pytest.mark.parametrize("name", list(NAMED))
def test_named_scenarios(cpu: TorchBackend, name: str) -> None:
    ok(run_scenario(named_scenario(name), cpu))


def test_swap_preemption_moves_real_kv_and_matches_hf(cpu: TorchBackend) -> None:
    # The named preemption scenario on the engine with KV swapped to host memory and back (the
    # transfer stream's copies): the tokens still equal HF greedy outputs.
    scenario = named_scenario("preemption").with_config(preemption="swap", page_alloc="on-demand")
    result = run_scenario(scenario, cpu)
    ok(result)
    kinds = [op.kind for op in result.trace.ops]
    assert kinds.count("kv_offload") == kinds.count("kv_load") > 0


@pytest.mark.parametrize(
    ("mode", "policy"), [("swap", "allocation-failure"), ("recompute", "retract-decode")]
)
def test_speculation_with_preemption_matches_hf(cpu: TorchBackend, mode: str, policy: str) -> None:
    # Verify steps on a pool that runs out: victims with a verify step in flight, swapped (their
    # real KV offloaded past the committed positions) or retracted (the step's tokens dropped and
    # sampled again); the tokens still equal HF greedy outputs.
    scenario = named_scenario("speculative").with_config(
        preemption=mode, page_alloc="on-demand", preempt_policy=policy, num_pages=56
    )
    result = run_scenario(scenario, cpu)
    ok(result)
    sched = result.scheduler
    assert sched.preemptions > 0
    assert sched.spec.stats.drafted > 0  # (a random model rejects them: their KV is junk)


def test_mixed_batches_of_an_on_demand_scheduler_match_hf(cpu: TorchBackend) -> None:
    # Recompute chunks and decodes in one forward (phase "mixed"), on the general attention path.
    example = Path(__file__).resolve().parents[1] / "examples" / "ondemand_scheduler.py"
    factory = SchedulerSpec(f"{example}:make_scheduler").factory()
    result = run_scenario(named_scenario("preemption"), cpu, scheduler=factory)
    ok(result)
    assert any(op.kind == "forward" and op.label.startswith("M") for op in result.trace.ops)


def test_early_eos_stops_where_the_reference_says(cpu: TorchBackend) -> None:
    result = run_scenario(named_scenario("early-eos"), cpu)
    ok(result)
    eos = result.scenario.config.eos_token_id
    stopped = [o for o in result.outcomes if o.finish_reason == "eos"]
    assert stopped and all(o.tokens[-1] == eos and len(o.tokens) < 8 for o in stopped)


def test_trace_mirrors_the_simulator(cpu: TorchBackend) -> None:
    """With arrivals at 0 and EOS ignored, scheduling depends on nothing the backends differ in:
    both must record the same operations with the same footprints."""
    requests = tuple(
        RequestSpec(u, tuple(range(10 + u, 30 + 3 * u)), max_tokens=5, ignore_eos=True)
        for u in range(3)
    )
    scenario = replace(named_scenario("basic"), requests=requests).with_config(max_extend_tokens=16)

    def shape(result: RunResult) -> list[tuple[object, ...]]:
        return [
            (
                op.agent,
                op.kind,
                op.label,
                op.step,
                op.phase,
                op.batch,
                op.uids,
                op.records,
                op.waits,
                [(a.buffer, a.mode, a.cells.tolist()) for a in op.accesses],
            )
            for op in result.trace.ops
        ]

    real, sim = run_scenario(scenario, cpu), run_scenario(scenario, SimBackend())
    ok(real)
    assert shape(real) == shape(sim)
    assert all(op.start is not None and op.end is not None for op in real.trace.ops)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("llama", dict(tie_word_embeddings=True)),
        ("qwen2", dict(tie_word_embeddings=False)),
    ],
)
def test_checkpoint_directory(tmp_path: Path, model_type: str, extra: dict[str, object]) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=2,
        **extra,
    )
    weights = random_weights(ModelSpec.from_config(cfg), 7, torch.device("cpu"), torch.float32)
    save_checkpoint(cfg, weights, tmp_path)
    backend = make_torch_backend("cpu", model=str(tmp_path))
    assert backend.spec.tied == extra["tie_word_embeddings"]
    assert backend.spec.qkv_bias == (model_type == "qwen2")
    ok(run_scenario(named_scenario("page-size-4"), backend))


def test_bad_options_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UserError, match=r"no config\.json"):
        make_torch_backend("cpu", model=str(tmp_path))
    with pytest.raises(UserError, match="not a checkpoint directory"):
        make_torch_backend("cpu", model=str(tmp_path / "missing"))
    with pytest.raises(UserError, match="unknown preset"):
        make_torch_backend("cpu", preset="huge")
    with pytest.raises(UserError, match="needs --backend cuda"):
        make_torch_backend("cpu", sanitize=True)
    if not torch.cuda.is_available():
        assert cli_main(["run", "--backend", "cuda"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no CUDA device" in err


def test_preset_config_round_trips() -> None:
    spec = ModelSpec.from_config(preset_config("qwen3-0.6b"))
    shape = (spec.layers, spec.hidden, spec.head_dim, spec.tied, spec.qk_norm)
    assert shape == (28, 1024, 128, True, True)


def test_seeded_sampling() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    hot = [SamplingParams(temperature=1.0, top_k=20, top_p=0.9)] * 4
    draw = [sample(logits, hot, torch.Generator().manual_seed(s)).tolist() for s in (1, 1, 2)]
    assert draw[0] == draw[1]
    greedy = sample(logits, [None, SamplingParams(temperature=0.7, top_k=1)] * 2, None)
    assert greedy.tolist() == logits.argmax(-1).tolist()
    top1 = logits.argsort(-1, descending=True)[:, :20]
    assert all(t in top1[i].tolist() for i, t in enumerate(draw[0]))


def test_scenario_is_fitted_to_the_model(cpu: TorchBackend) -> None:
    base = named_scenario("basic")
    wide = replace(
        base,
        config=replace(base.config, vocab_size=5000),
        requests=(RequestSpec(0, (4000, 5, 6000), max_tokens=2),),
    )
    fitted: Scenario = cpu.prepare(wide)
    assert fitted.config.vocab_size == 1024
    assert fitted.requests[0].prompt == (4000 % 1024, 5 + 37, 1024 + 1000)  # still out of range
    result = run_scenario(wide, cpu)
    ok(result)
    assert result.outcomes[0].finish_reason == "rejected"


def test_prompt_mapping_keeps_prefixes_and_spreads_a_constant_prompt() -> None:
    from overlapcheck.backends.gpu.prepare import map_prompt

    constant = map_prompt((3,) * 40, 64, 1024)
    assert len(set(constant)) == 40  # no position repeats another's token
    a, b = map_prompt((1, 2, 3, 4), 64, 1024), map_prompt((1, 2, 9, 4), 64, 1024)
    assert a[:2] == b[:2] and a[2] != b[2]  # the cache's view: shared prefix, then a difference
    assert map_prompt((-1, 70), 64, 1024) == (-1, 1024 + 6)  # out of range stays out of range


def test_an_overwritten_prompt_token_shows_in_the_output(cpu: TorchBackend) -> None:
    """What `chunk-sample-overwrite` does to a shrunk prompt of one repeated id: the mapped prompt
    must make the overwrite change the greedy output, or no replay can show the race."""
    from overlapcheck.backends.gpu.prepare import map_prompt

    assert cpu.oracle is not None
    prompt = map_prompt((3,) * 9, 1024, cpu.spec.vocab_size)
    sample = cpu.oracle.greedy(prompt[:8], 1)[0]
    corrupted = (*prompt[:8], sample)
    forcing = cpu.oracle.forcing(prompt)
    assert max(forcing.accept(t) for t in cpu.oracle.greedy(corrupted, 4)) > 1.0


def test_teacher_forcing_fails_a_non_token_without_feeding_it_to_the_reference(
    cpu: TorchBackend,
) -> None:
    """A race can hand the host -1 (the copy had not landed): the reference must judge it, not
    crash on it (on CUDA the embedding lookup would be a device-side assert that kills the run)."""
    assert cpu.oracle is not None
    prompt = (5, 6, 7)
    first = cpu.oracle.greedy(prompt, 1)[0]
    forcing = cpu.oracle.forcing(prompt)
    assert forcing.accept(-1) == float("inf")
    assert forcing.accept(first) == float("inf")  # after a non-token nothing can be judged
    assert forcing.deficits == [float("inf"), float("inf")]
    healthy = cpu.oracle.forcing(prompt)
    assert healthy.accept(first) == pytest.approx(0.0)


def test_calibration_measures_a_real_backend(cpu: TorchBackend) -> None:
    from overlapcheck.backends.sim.timing import Profile
    from overlapcheck.calibrate.gpu import measure

    base = Profile()
    got = measure(cpu, [named_scenario("basic"), named_scenario("chunked-long")], base)
    assert got.hold == 0.0  # the CPU runs stream work inline: nothing to hold
    p = got.profile
    # A real transformer on a CPU is far slower than the default (GPU-scale) profile.
    assert p.launch > 10 * base.launch and p.forward > 10 * base.forward
    assert set(got.phases) == {"schedule", "launch", "process"} and got.leads
    # Inline stream work: each forward ends inside its launch phase, not after it. Which
    # forwards count as launch-bound depends on the fitted forward time, so on a loaded machine
    # there may be none: then the profile keeps the base's offsets.
    assert all(t < 0 for t in got.tails) and all(q < 0 for q in got.queued)
    assert p.forward_tail == pytest.approx(
        statistics.median(got.tails) if got.tails else base.forward_tail
    )
    assert p.d2h_queued == pytest.approx(
        statistics.median(got.queued) if got.queued else base.d2h_queued
    )


def test_calibration_check_compares_every_named_scenario(
    cpu: TorchBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from overlapcheck.backends.sim.timing import Profile
    from overlapcheck.calibrate.gpu import check
    from overlapcheck.formats.trace_file import load_trace

    rows = check(cpu, Profile(), repeats=1, traces=tmp_path, say=print)
    assert len(rows) == 4 * len(NAMED)
    totals = {r.scenario: r for r in rows if r.figure == "total ms"}
    assert set(totals) == set(NAMED)
    for r in totals.values():
        # The default profile is GPU-scale; host phases re-measured on the CPU runs are not.
        assert 0 < r.sim < r.gpu and r.as_run > r.sim
        assert r.gpu_spread == 0.0  # one repeat: no range
    out = capsys.readouterr().out
    assert "sim, host as run" in out
    # The GPU-scale default profile is far off a CPU; re-measuring the host brings it closer.
    calibrated, as_run = re.search(r"within 15%: (\d+)/\d+ .*?, (\d+)/", out).groups()
    assert int(calibrated) < int(as_run)

    # Each scenario's last real run and the simulator's run of the same work are saved.
    def lengths(path: Path) -> dict[int, int]:
        counts: dict[int, int] = {}
        for m in load_trace(path).trace.messages:
            if m.kind == "token":
                counts[m.uid] = counts.get(m.uid, 0) + 1
        return counts

    ran = lengths(tmp_path / "early-eos-overlap-cpu.json")
    assert ran and ran == lengths(tmp_path / "early-eos-overlap-sim.json")


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_a_plugged_in_scheduler_runs_unchanged_on_the_real_engine(
    cpu: TorchBackend, loop: str
) -> None:
    from overlapcheck.harness.scheduler_spec import SchedulerSpec

    examples = Path(__file__).resolve().parent.parent / "examples"
    minimal = SchedulerSpec(f"{examples / 'minimal_scheduler.py'}:make_scheduler").factory()
    scenario = named_scenario("basic").with_config(loop=loop)
    mine = run_scenario(scenario, cpu, scheduler=minimal)
    ours = run_scenario(scenario, cpu)
    assert mine.ok, [v.line() for v in mine.violations]
    assert [o.tokens for o in mine.outcomes] == [o.tokens for o in ours.outcomes]
    assert any("pages-conserved" in n for n in mine.notices)  # no books(): one notice


def test_a_plugged_in_schedulers_counterexample_replays_on_the_real_engine(
    cpu: TorchBackend, tmp_path: Path
) -> None:
    from overlapcheck.backends.sim.timing import Profile
    from overlapcheck.formats import counterexample
    from overlapcheck.harness.scheduler_spec import SchedulerSpec
    from overlapcheck.replay.gpu import replay_verdicts

    upstream = Path(__file__).resolve().parent.parent / "examples" / "upstream_overlap.py"
    spec = SchedulerSpec(f"{upstream}:make_scheduler")
    run = run_scenario(named_scenario("basic"), SimBackend(), scheduler=spec.factory())
    assert run.violations and run.violations[0].invariant == "exact-length"
    cex = counterexample.load(counterexample.save(run, Profile(), {}, tmp_path, scheduler=spec))
    assert cex.scheduler == spec
    _, verdicts = replay_verdicts(cex, cpu, 1)
    assert [v.reproduced for v in verdicts] == [True]
    # the fixed variant, named on the command line, replays the same file clean
    fixed = cex.with_scheduler(SchedulerSpec(f"{upstream}:make_fixed_scheduler"))
    _, verdicts = replay_verdicts(fixed, cpu, 1)
    assert [v.reproduced for v in verdicts] == [False]


@pytest.mark.parametrize(
    ("fault", "fix"),
    [
        ("chunk-sample-overwrite", "forced"),  # the fix moves the sample: the order is harmless
        ("staging-buffer-reuse", "the host waits on e1"),  # before restaging: the copy ran
        ("copy-done-wrong-stream", "the host waits on e3"),  # the event follows the copy
    ],
)
def test_gates_on_the_real_engine_open_with_the_fault_and_are_released_by_the_fix(
    cpu: TorchBackend, monkeypatch: pytest.MonkeyPatch, fault: str, fix: str
) -> None:
    """The keeper over the real engine's own operations, with a driver that queues as a GPU
    stream does (the CPU engine itself runs each op at issue, where a gate can only time out)."""
    from test_gates import COUNTEREXAMPLES, Queued

    from overlapcheck.backends.gates import GateKeeper
    from overlapcheck.backends.gpu.device import TorchDevice
    from overlapcheck.formats import counterexample
    from overlapcheck.replay.gpu import replay_once, with_margin
    from overlapcheck.replay.plan import plan_replay
    from overlapcheck.replay.sim import replay_on_sim

    def queued(device: TorchDevice, gates: list[Gate], bound: float) -> GateKeeper | None:
        return GateKeeper(gates, Queued(len(gates)), device.trace) if gates else None

    monkeypatch.setattr(TorchDevice, "_gates", queued)
    cex, _ = with_margin(counterexample.load(COUNTEREXAMPLES / f"{fault}.json"))
    sim = replay_on_sim(cex)
    plan = plan_replay(sim.trace)
    on, _ = replay_once(cex, cpu, plan, sim.deliveries, 0)
    assert [g.state for g in on.gates] == ["forced"]
    # gates are not in the trace: happens-before over the real footprints still has the race
    assert on.race is not None and on.race.startswith(plan.gates[0].race.split(" on ")[0])
    off = cex.without_faults()
    verdict, _ = replay_once(off, cpu, plan, replay_on_sim(off).deliveries, 0)
    [gate] = verdict.gates
    assert verdict.clean and fix in (gate.state if fix == "forced" else gate.detail)
