"""Gates: the replay plan forces each race fault's order, the keeper releases a gate the scheduler
orders the other way instead of hanging on it, and a gate nobody opens times out with its
message. The CUDA mechanism itself is tested in test_gpu_replay_cuda.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.gates import (
    CLOSED,
    OPENED,
    RELEASED,
    Gate,
    GateKeeper,
    HostGates,
)
from overlapcheck.core.trace import HOST, Op, Trace
from overlapcheck.formats import counterexample
from overlapcheck.replay.plan import plan_replay
from overlapcheck.replay.sim import replay_on_sim

COUNTEREXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "gpu-replay"

# fault -> (held op, opener): the later-issued op ran first in the simulator's run.
RACES = {
    "chunk-sample-overwrite": ("P1", "h2d token_pool"),
    "staging-buffer-reuse": ("metadata P1", "stage D2"),
    "copy-done-wrong-stream": ("d2h P1", "read P1"),
}


def _plan(fault: str):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch", reason="the GPU replay module imports the torch engine")
    from overlapcheck.replay.gpu import with_margin

    cex, _ = with_margin(counterexample.load(COUNTEREXAMPLES / f"{fault}.json"))
    return cex, plan_replay(replay_on_sim(cex).trace)


@pytest.mark.parametrize("fault", list(RACES))
def test_each_race_faults_counterexample_gets_a_gate_that_replaces_its_delays(fault: str) -> None:
    _, plan = _plan(fault)
    assert [(g.held_label, g.opener_label) for g in plan.gates] == [RACES[fault]]
    assert plan.delays and plan.sleeps == []
    assert all("replaced by gate 1" in line for line in plan.lines()[1:])


def test_without_a_race_to_force_the_delays_stay_sleeps_and_say_why() -> None:
    _, plan = _plan("finish-by-can-decode")
    assert plan.gates == () and "no race to force" in plan.lines()[-1]
    # a race that the simulator's run had in issue order is not forced either
    _, plan = _plan("free-slot-early")
    assert plan.gates == () and "ran in issue order" in plan.no_gate
    # a device that cannot gate sleeps, and says why
    cex, _ = _plan("staging-buffer-reuse")
    plan = plan_replay(replay_on_sim(cex).trace, "no Triton")
    assert plan.gates == () and plan.sleeps == list(plan.delays)
    assert plan.lines()[-1].endswith("-> sleep (no Triton)")


class Queued:
    """A driver that queues like a GPU stream: a hold never blocks the host; the flag's last value
    is what the held op saw once the run is over (`results`)."""

    kind = "queued (test)"
    bound = 1.0

    def __init__(self, count: int) -> None:
        self.values = [CLOSED] * count
        self.held = [False] * count
        self.calls: list[str] = []

    def hold(self, gate: int, stream: str) -> None:
        self.held[gate] = True
        self.calls.append(f"hold {stream}")

    def open(self, gate: int, stream: str | None) -> None:
        self.values[gate] = OPENED
        self.calls.append(f"open {stream or HOST}")

    def release(self, gate: int) -> None:
        self.values[gate] = RELEASED
        self.calls.append("release")

    def results(self) -> list[tuple[int, float]]:
        return [(v if h else CLOSED, 0.0) for v, h in zip(self.values, self.held, strict=True)]


def _op(trace: Trace, agent: str, kind: str, step: int, label: str) -> Op:
    op = Op(len(trace.ops), agent, kind, step, "launch", 0.0, label=label)
    trace.ops.append(op)
    return op


GATE = Gate((0, "engine", "forward", 0), "P1", (1, "scheduler", "h2d", 0), "h2d", "WAW on x")


def test_the_keeper_opens_a_gate_after_its_opener_on_the_openers_stream() -> None:
    trace, driver = Trace(), Queued(1)
    keeper = GateKeeper([GATE], driver, trace)
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))
    keeper.recorded("engine", 3)
    keeper.host_blocks(1)  # an event not after the held op: nothing to release
    keeper.after(_op(trace, "scheduler", "h2d", 1, "h2d"))
    keeper.host_blocks(3)
    assert driver.calls == ["hold engine", "open scheduler"]
    [outcome] = keeper.outcomes()
    assert outcome.forced and outcome.line().startswith("forced: `h2d` ran before `P1`")


def test_a_host_wait_behind_the_held_op_releases_the_gate_before_the_host_blocks() -> None:
    trace, driver = Trace(), Queued(1)
    keeper = GateKeeper([GATE], driver, trace)
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))
    keeper.recorded("engine", 2)  # recorded after the held op on its stream
    keeper.waited("scheduler", 2)  # so the scheduler stream is now after it too
    keeper.recorded("scheduler", 5)
    keeper.host_blocks(5)
    assert driver.calls == ["hold engine", "release"]
    keeper.after(_op(trace, "scheduler", "h2d", 1, "h2d"))  # too late: already released
    [outcome] = keeper.outcomes()
    assert outcome.state == "cannot happen"
    assert outcome.line() == (
        "fix holds: the racy order cannot happen (the host waits on e5, which follows `P1`, "
        "before `h2d`)"
    )


def test_an_opener_ordered_after_the_held_op_releases_the_gate() -> None:
    trace, driver = Trace(), Queued(1)
    keeper = GateKeeper([GATE], driver, trace)
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))
    keeper.recorded("engine", 1)
    keeper.waited("scheduler", 1)
    keeper.after(_op(trace, "scheduler", "h2d", 1, "h2d"))
    assert driver.calls == ["hold engine", "release"]
    assert "is ordered after `P1` on the scheduler stream" in keeper.outcomes()[0].detail


def test_a_run_that_ends_without_the_opener_releases_and_an_unissued_gate_is_not_reached() -> None:
    other = Gate((5, "engine", "forward", 0), "D6", (6, HOST, "stage", 0), "stage D7", "WAR on y")
    trace, driver = Trace(), Queued(2)
    keeper = GateKeeper([GATE, other], driver, trace)
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))
    keeper.host_blocks(None)
    first, second = keeper.outcomes()
    assert first.detail == "the run ended before `h2d`"
    assert second.state == "not reached" and "`D6` not issued" in second.line()


def test_a_gate_that_never_opens_times_out_with_its_message() -> None:
    trace, driver = Trace(), HostGates(1, bound=0.01)
    keeper = GateKeeper([GATE], driver, trace)
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))  # waits out the bound, here
    [outcome] = keeper.outcomes()
    assert outcome.state == "timed out" and outcome.waited >= 0.01
    assert outcome.line() == (
        "fix holds: the racy order cannot happen (`h2d` did not come within the gate's bound, "
        "0.01 s)"
    )
    # a gate opened before its held op is issued passes at once
    trace, driver = Trace(), HostGates(1, bound=5.0)
    keeper = GateKeeper([GATE], driver, trace)
    keeper.after(_op(trace, "scheduler", "h2d", 1, "h2d"))
    keeper.before(_op(trace, "engine", "forward", 0, "P1"))
    assert keeper.outcomes()[0].forced
