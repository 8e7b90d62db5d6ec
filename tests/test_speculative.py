"""Speculative decoding: the contract, the reference scheduler's verify steps, and the checks that
judge them (multi-token steps, placeholders)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.batch import PLACEHOLDER, SPEC_FIELDS, BatchInput, SeqWork
from overlapcheck.core.config import ConfigError, LoopKind, SchedulerConfig
from overlapcheck.core.contract import ContractError
from overlapcheck.core.footprints import FootprintRecorder
from overlapcheck.core.scenario import Scenario
from overlapcheck.core.speculative import accepted, parse_output
from overlapcheck.core.trace import Trace
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.reference.drafter import prompt_lookup
from overlapcheck.reference.speculative import SpecDecoder
from overlapcheck.scenarios.named import NAMED

LOOPS: tuple[LoopKind, ...] = ("overlap", "normal")


def spec_scenario(**changes: object) -> Scenario:
    return NAMED["speculative"]().with_config(**changes)


def run(sc: Scenario, only: tuple[str, ...] | None = None, scheduler: str = "") -> RunResult:
    factory = SchedulerSpec(scheduler).factory() if scheduler else None
    return run_scenario(sc, SimBackend(), invariants=only, scheduler=factory)


def decoder(result: RunResult) -> SpecDecoder:
    spec = result.scheduler.spec
    assert isinstance(spec, SpecDecoder)
    return spec


# -- the parts ------------------------------------------------------------------------------


def test_prompt_lookup_continues_the_latest_match_and_its_period() -> None:
    assert prompt_lookup([5, 6, 7, 5, 6], 4) == [7, 5, 6, 7]  # "5 6" recurs: then 7, and around
    assert prompt_lookup([1, 2, 3, 4], 3) == []  # nothing recurs
    assert prompt_lookup([9, 9], 3) == [9, 9, 9]
    assert prompt_lookup([1, 2, 1, 3, 1], 2) == [3, 1]  # the latest "1" wins


def test_a_step_emits_the_agreed_drafts_and_one_more() -> None:
    assert accepted([4, 5, 6], [4, 5, 9, 1]) == 3
    assert accepted([4, 5, 6], [1, 5, 6, 1]) == 1  # a later agreement counts for nothing
    assert accepted([], [7]) == 1
    batch = BatchInput(3, "decode", (_seq(drafts=2), _seq(slot=1, drafts=0)))
    # tokens: 3 cells, 1 cell; then the counts (a -1 count: read before the copy landed)
    assert parse_output(batch, [7, 8, 9, 4, 2, 1]) == [[7, 8], [4]]
    assert parse_output(batch, [-1] * 6) == [[-1], [-1]]


def test_draft_tokens_is_validated() -> None:
    with pytest.raises(ConfigError, match="draft_tokens"):
        SchedulerConfig(draft_tokens=-1)
    with pytest.raises(ConfigError, match="draft_tokens"):
        SchedulerConfig(draft_tokens=9)


def _seq(slot: int = 0, drafts: int = 2, shift: int = 0, source: int = -1) -> SeqWork:
    start = 10
    end = start + shift + drafts + 1
    return SeqWork(1 + slot, slot, start, end, slot, start + 1, list(range(64))[:end], True,
                   drafts, shift, source)  # fmt: skip


def test_a_verify_batch_is_checked_against_the_contract() -> None:
    cfg = SchedulerConfig(num_slots=4, num_pages=64, max_seq_len=32, draft_tokens=2)
    rec = FootprintRecorder(cfg, Trace())
    rec.metadata_copy(BatchInput(2, "decode", (_seq(shift=2, source=0),)), "scheduler", 0.0)
    rec.forward(BatchInput(2, "decode", (_seq(shift=2, source=0),)), "engine", 0.0)
    bad = [
        _seq(drafts=3),  # more than k
        replace(_seq(), end=14),  # not start + shift + drafts + 1
        _seq(shift=1),  # a shift with no placeholder source
        replace(_seq(), out_col=12),  # not right after start
    ]
    for seq in bad:
        with pytest.raises(ContractError):
            rec.forward(BatchInput(2, "decode", (seq,)), "engine", 0.0)
    with pytest.raises(ContractError, match="draft_tokens 0"):
        FootprintRecorder(replace(cfg, draft_tokens=0), Trace()).forward(
            BatchInput(2, "decode", (_seq(),)), "engine", 0.0
        )
    # the placeholder travels in the metadata as the sentinel
    flat = BatchInput(2, "decode", (_seq(shift=2, source=0),)).metadata(SPEC_FIELDS)
    assert flat[6] == PLACEHOLDER and flat[7] == 0


def test_a_placeholder_resolution_reads_the_producing_step_and_writes_the_shift() -> None:
    cfg = SchedulerConfig(num_slots=4, num_pages=64, max_seq_len=32, draft_tokens=2)
    rec = FootprintRecorder(cfg, Trace())
    batch = BatchInput(5, "decode", (_seq(drafts=1), _seq(slot=1, shift=2, source=3)))
    op = rec.resolve(batch, "engine", 0.0)
    (read,), (write,) = ([a.cells.tolist() for a in op.accesses if a.mode == m] for m in "rw")
    assert read == [0 * 5 + 3]  # spec_out of batch 4 (parity 0), its sequence 3
    assert write == [1 * SPEC_FIELDS * 5 + 1 * SPEC_FIELDS + 6]  # batch 5's metadata, seq 1


# -- the reference scheduler ----------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_speculation_gives_the_outputs_of_one_token_steps(loop: LoopKind) -> None:
    on = run(spec_scenario(loop=loop))
    off = run(spec_scenario(loop=loop, draft_tokens=0))
    assert on.ok and off.ok
    assert [o.tokens for o in on.outcomes] == [o.tokens for o in off.outcomes]
    assert [o.finish_reason for o in on.outcomes] == ["length", "length", "eos", "length", "length"]
    stats = decoder(on).stats
    accepted_drafts = stats.emitted - stats.steps
    assert 0 < accepted_drafts < stats.drafted  # repetitive prompts accept, others do not
    assert on.iterations < off.iterations  # fewer steps for the same tokens


def test_only_the_overlap_loop_launches_steps_with_placeholders() -> None:
    kinds = {
        loop: Counter(op.kind for op in run(spec_scenario(loop=loop)).trace.ops) for loop in LOOPS
    }
    assert kinds["overlap"]["resolve"] > 0 and kinds["normal"]["resolve"] == 0
    assert decoder(run(spec_scenario())).stats.waits > 0  # its step in flight may end it


def test_draft_tokens_zero_records_the_trace_of_one_token_steps() -> None:
    # nothing of speculation in the trace: no draft copies, no resolutions, 5-field metadata
    result = run(spec_scenario(draft_tokens=0))
    buffers = {a.buffer for op in result.trace.ops for a in op.accesses}
    assert not {"draft_pool", "spec_out"} & buffers
    assert result.trace.sizes["host:staging"] == 5 * (4 + 1)


def test_a_plugged_in_scheduler_runs_with_speculation_on() -> None:
    plugged = run(spec_scenario(), scheduler="overlapcheck.reference.scheduler:Scheduler")
    assert plugged.ok and plugged.trace_hash == run(spec_scenario()).trace_hash
    # one that ignores the switch decodes a token a step against the same device
    minimal = run(spec_scenario(), scheduler="examples/minimal_scheduler.py:make_scheduler")
    assert minimal.ok and minimal.iterations > plugged.iterations


# -- the checks fire on the illegal neighbour, and stay quiet on the legal one -----------------

FAULTS_CAUGHT = {  # fault -> (the check that reports it first in the speculative scenario)
    "stale-placeholder": "placeholder",
    "free-row-in-verify": "slot-not-in-flight",
    "resolve-unordered": "no-race",
    "reads-done-early": "no-race",
    "placeholder-underflow": "oracle",
}


@pytest.mark.parametrize("fault", sorted(FAULTS_CAUGHT))
def test_each_fault_of_speculation_is_caught(fault: str) -> None:
    result = run(spec_scenario(faults=frozenset({fault})))
    assert [v.invariant for v in result.violations] == [FAULTS_CAUGHT[fault]]


def test_placeholder_fires_on_a_stale_resolution_and_on_an_unresolved_input() -> None:
    assert run(spec_scenario(), only=("placeholder",)).ok
    stale = run(spec_scenario(faults=frozenset({"stale-placeholder"})), only=("placeholder",))
    assert "a stale placeholder" in stale.violations[0].message
    unordered = run(spec_scenario(faults=frozenset({"resolve-unordered"})), only=("placeholder",))
    assert "reached the forward's input" in unordered.violations[0].message


def test_kv_provenance_fires_when_an_uncommitted_position_is_read_as_committed() -> None:
    # An unresolved placeholder wraps to the largest shift: the step takes positions that only
    # rejected drafts and padding were written to for committed ones.
    checks = ("kv-provenance",)
    assert run(spec_scenario(), only=checks).ok
    bad = run(spec_scenario(faults=frozenset({"resolve-unordered"})), only=checks)
    assert "no forward of this request has sampled that position yet" in bad.violations[0].message


def test_exact_length_and_work_bound_judge_multi_token_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = ("exact-length", "work-bound")
    assert run(spec_scenario(), only=checks).ok

    def uncut(self: SpecDecoder, reqs: object, output: object, copy_done: object) -> None:
        from overlapcheck.core.messages import TokenMsg

        s = self.s
        copy_done.synchronize()  # type: ignore[attr-defined]
        for req, tokens in zip(reqs, output.emitted(), strict=True):  # type: ignore[attr-defined]
            req.inflight -= 1
            self.state(req).unresolved -= 1
            if not req.done:
                req.kv_len = req.prompt_len + len(req.outputs) + len(tokens) - 1
                for token in tokens:  # every token of the step, past max_tokens too
                    req.outputs.append(token)
                    s._send(TokenMsg(req.uid, token, len(req.outputs) >= req.max_output))  # type: ignore[attr-defined]
            s._maybe_release(req)

    monkeypatch.setattr(SpecDecoder, "process", uncut)
    result = run(spec_scenario(), only=checks)
    assert result.violations and result.violations[0].invariant == "exact-length"


def test_work_bound_fires_on_drafts_past_max_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # Drafts that ignore the room max_tokens leaves: the step verifies positions past the last
    # output the request may have.
    checks = ("work-bound",)
    assert run(spec_scenario(), only=checks).ok
    original = SpecDecoder._plan

    def greedy(self: SpecDecoder, req: object, batch_id: int) -> object:
        planned = original(self, req, batch_id)  # type: ignore[arg-type]
        if planned is None:
            return None
        start, shift, source, drafts = planned
        return start, shift, source, (tuple(drafts) + (3,) * self.k)[: self.k]

    monkeypatch.setattr(SpecDecoder, "_plan", greedy)
    result = run(spec_scenario(), only=checks)
    assert result.violations and "max_tokens 10 needs only 10" in result.violations[0].message


def test_kv_shadow_judges_only_committed_positions_of_a_verify_step() -> None:
    result = run(spec_scenario(), only=("kv-provenance",))
    assert result.ok and not np.any([r for r in result.notices if "kv-provenance" in r])


def test_placeholder_fires_on_the_sentinel_in_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from overlapcheck.core.messages import TokenMsg

    original = SpecDecoder.process

    def leaky(self: SpecDecoder, reqs: tuple, output: object, copy_done: object) -> None:  # type: ignore[type-arg]
        original(self, reqs, output, copy_done)  # type: ignore[arg-type]
        live = [r for r in reqs if not r.done]
        if live:  # a reply built from a buffer the device never resolved
            self.s._send(TokenMsg(live[0].uid, PLACEHOLDER, False))  # type: ignore[attr-defined]

    monkeypatch.setattr(SpecDecoder, "process", leaky)
    result = run(spec_scenario(), only=("placeholder",))
    assert "the placeholder reached a token message" in result.violations[0].message
