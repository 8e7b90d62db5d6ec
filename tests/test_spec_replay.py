"""Speculative counterexamples replay on the real engine: the scheduler drafts the engine's own
tokens exactly as far as the simulator's steps accepted, so the replay takes the recorded steps
(the same acceptance per step, batch for batch) and shows the recorded finding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend  # noqa: E402
from overlapcheck.bench.gpu_replay import SPEC_RACE_FAULTS  # noqa: E402
from overlapcheck.core.speculative import DraftQuery  # noqa: E402
from overlapcheck.core.trace import Trace, Verified  # noqa: E402
from overlapcheck.formats import counterexample  # noqa: E402
from overlapcheck.reference.drafter import PromptLookup, prompt_lookup  # noqa: E402
from overlapcheck.reference.faults import FAULTS  # noqa: E402
from overlapcheck.replay.drafts import (  # noqa: E402
    ReplayDrafts,
    Rows,
    Step,
    compare,
)
from overlapcheck.replay.gpu import (  # noqa: E402
    Verdict,
    replay_once,
    replay_verdicts,
    speculative_record,
    with_margin,
)
from overlapcheck.replay.plan import plan_replay  # noqa: E402
from overlapcheck.replay.sim import replay_on_sim  # noqa: E402

COUNTEREXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "gpu-replay"
SPECULATIVE = [name for name, f in FAULTS.items() if f.speculative]


@pytest.fixture(scope="module")
def cpu() -> Iterator[TorchBackend]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_torch_backend("cpu", preset="tiny")
    torch.set_num_threads(threads)


def _query(uid: int = 1, batch: int = 5, wanted: int = 3, skip: int = 0) -> DraftQuery:
    return DraftQuery(uid, batch, (7, 8, 9, 7, 8), (), skip, wanted)


def test_prompt_lookup_as_a_drafter_skips_what_the_host_does_not_know() -> None:
    context = [7, 8, 9, 7, 8]
    assert PromptLookup().draft(_query()) == prompt_lookup(context, 3)
    assert PromptLookup().draft(_query(skip=1)) == prompt_lookup(context, 4)[1:]


def test_replay_drafts_agree_exactly_as_far_as_the_step_accepted() -> None:
    rows = Rows({1: [((7, 8), [9, 7, 8, 50, 60])]})
    steps = {(5, 1): Step(first=3, drafts=3, accepted=1)}
    drafts = ReplayDrafts(steps, rows, vocab_size=100)
    out = drafts.draft(_query())
    assert out[0] == 7  # the row's token at position 3
    assert out[1] != 8 and len(out) == 3  # then certainly wrong, as many as recorded
    assert drafts.draft(_query(batch=6)) == PromptLookup().draft(_query(batch=6))  # no record
    as_recorded = [Verified(5, 0, 1, -1, 3, 2)]
    assert compare(steps, as_recorded).differ == 0
    other = compare(steps, [Verified(5, 0, 1, -1, 3, 3), Verified(6, 0, 1, -1, 0, 1)])
    assert (other.same, other.differ) == (0, 2)
    assert other.first == "batch 5 request 1: drafts/accepted 3/2, recorded 3/1"
    assert compare(steps, []).first == "batch 5 request 1: recorded, not run"


def _acceptance(trace: Trace) -> list[tuple[int, int, int, int]]:
    return [(v.batch, v.uid, v.drafts, v.emitted) for v in trace.verified]


def _replay(cpu: TorchBackend, fault: str, recorded_drafts: bool) -> tuple[Verdict, Trace, Trace]:
    cex, _ = with_margin(counterexample.load(COUNTEREXAMPLES / f"{fault}.json"))
    record, drafts = speculative_record(cex, cpu)
    plan = plan_replay(replay_on_sim(cex).trace)
    verdict, result = replay_once(
        cex, cpu, plan, record.deliveries, 0, drafts if recorded_drafts else None
    )
    assert cpu.device is not None
    cpu.device.finish()
    return verdict, record.trace, result.trace


def test_a_speculative_race_replays_on_the_cpu_engine_with_the_recorded_acceptance(
    cpu: TorchBackend,
) -> None:
    """`reads-done-early` (outputs stay right; only the race shows): with the replay's drafts,
    every verify step on the CPU engine accepts what the simulator's did, and the race is there.
    With the engine drafting by prompt lookup the schedule leaves the record (the test's teeth)."""
    verdict, sim, real = _replay(cpu, "reads-done-early", recorded_drafts=True)
    assert _acceptance(real) == _acceptance(sim)
    assert verdict.reproduced and verdict.off_record == 0, verdict.to_json()
    assert any(v.drafts and v.emitted > 1 for v in real.verified)  # drafts were accepted
    _, sim, own = _replay(cpu, "reads-done-early", recorded_drafts=False)
    assert _acceptance(own) != _acceptance(sim)


@pytest.mark.slow
@pytest.mark.parametrize("fault", SPECULATIVE)
def test_every_speculative_counterexample_replays_on_the_cpu_engine(
    cpu: TorchBackend, fault: str
) -> None:
    """Each speculative fault's file: the recorded acceptance step for step up to the finding,
    the finding reproduced, the fix clean under the same plan."""
    verdict, sim, real = _replay(cpu, fault, recorded_drafts=True)
    assert verdict.reproduced, verdict.to_json()
    if fault in SPEC_RACE_FAULTS or fault == "stale-placeholder":
        assert _acceptance(real) == _acceptance(sim)
    cex = counterexample.load(COUNTEREXAMPLES / f"{fault}.json")
    _, off = replay_verdicts(cex, cpu, 1, cex.without_faults())
    assert all(v.clean and v.off_record == 0 for v in off), [v.to_json() for v in off]
