"""A decode batch runs the same requests in the same rows step after step, and the checks that
look at every sequence of every forward judge such a forward as a whole: `progress`, `work-bound`
and `slot-not-in-flight` keep the last forward's batch and book its per-request state only when
the batch changes. Each case runs twice, with the shortcut and with every sequence judged one by
one (`batched = False`); the traces and every violation must agree, so the shortcut can neither
hide a finding nor move one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.sim.timing import SeededDelay, Timing
from overlapcheck.bench.sim_speed import decode_workload
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.progress import Progress
from overlapcheck.invariants.resources import SlotNotInFlight
from overlapcheck.invariants.work_bound import WorkBound
from overlapcheck.reference.faults import FAULTS
from overlapcheck.scenarios.strategies import scenarios

BATCHED = (Progress, WorkBound, SlotNotInFlight)

faulty = st.sampled_from(sorted(FAULTS)).flatmap(lambda f: scenarios(faults=frozenset({f})))


def both_ways(monkeypatch: pytest.MonkeyPatch, scenario: Any, seed: int) -> RunResult:
    """The run with the shortcuts, after asserting that it agrees with the run without them."""

    def run() -> RunResult:
        timing = Timing(source=SeededDelay(seed))
        return run_scenario(scenario, SimBackend(timing), keep_going=True)

    with monkeypatch.context() as m:
        for check in BATCHED:
            m.setattr(check, "batched", False)
        one_by_one = run()
    batched = run()
    assert batched.trace_hash == one_by_one.trace_hash
    assert [v.to_json() for v in batched.violations] == [v.to_json() for v in one_by_one.violations]
    return batched


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(faulty | scenarios(), st.integers(0, 2**16))
def test_the_batch_shortcuts_give_every_verdict_of_judging_each_sequence(
    scenario: Any, seed: int
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        both_ways(monkeypatch, scenario, seed)


def test_a_steady_decode_takes_the_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged one by one only when the batch changes: a decode of 8 requests over 64 steps books
    its slots' owners a handful of times, not at every forward."""
    settled = [0]
    real = SlotNotInFlight._settle

    def counted(self: SlotNotInFlight) -> None:
        settled[0] += 1
        real(self)

    both_ways(monkeypatch, decode_workload(max_tokens=64), 0)
    monkeypatch.setattr(SlotNotInFlight, "_settle", counted)
    result = run_scenario(decode_workload(max_tokens=64), SimBackend())
    assert result.ok
    forwards = sum(op.kind == "forward" for op in result.trace.ops)
    assert forwards > 60 and settled[0] <= 4


@pytest.mark.parametrize("sequence", [0, 5])
def test_a_wrong_input_id_mid_decode_is_found_where_it_is_read(
    monkeypatch: pytest.MonkeyPatch, sequence: int
) -> None:
    """Forty forwards into a steady decode, one sequence's kernel reads an input id that is not
    its request's token (a stale token-pool cell, say): `kv-provenance` names that forward."""
    real = SimDevice._read_inputs
    calls: dict[int, tuple[SimDevice, int]] = {}  # (the device kept, so that ids stay unique)

    def corrupted(self: SimDevice, parity: int, n: int, op: int) -> Any:
        count = calls.get(id(self), (self, 0))[1] + 1
        calls[id(self)] = (self, count)
        if count == 40:
            meta = self.metadata[parity, : n * self.fields].reshape(n, self.fields)
            slot, start = int(meta[sequence, 0]), int(meta[sequence, 1])
            self.token_pool[slot, start] = (self.token_pool[slot, start] + 1) % 1000 + 3
        return real(self, parity, n, op)

    monkeypatch.setattr(SimDevice, "_read_inputs", corrupted)
    result = both_ways(monkeypatch, decode_workload(max_tokens=64), 0)
    found = [v for v in result.violations if v.invariant == "kv-provenance"]
    assert found and found[0].uids == (sequence,)
    assert "the input id it gathers from token_pool is" in found[0].message
