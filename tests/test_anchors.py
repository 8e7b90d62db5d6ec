"""Anchored messages land in the window of their lifecycle point, in both loops.

Request 0 (uid 0) runs a chunked prompt and stops at a scripted EOS after a few tokens, so it has
a first chunk, a last launch, a finished message, and under overlap an extra round in flight
after it; request 1 arrives anchored to one of those points (or to request 0's abort). Each test
reads the trace to check where the arrival fell against the point and its deferred cleanup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.bench.mutants import BY_ID
from overlapcheck.bench.mutation_score import materialize
from overlapcheck.core.config import LoopKind, SchedulerConfig
from overlapcheck.core.scenario import Anchor, RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict

EOS = 2
LOOPS: tuple[LoopKind, ...] = ("overlap", "normal")


def _run(loop: LoopKind, second: RequestSpec, first: RequestSpec | None = None) -> RunResult:
    config = SchedulerConfig(num_slots=2, num_pages=64, max_extend_tokens=8, loop=loop)
    first = first or RequestSpec(
        0, tuple(range(10, 30)), max_tokens=8, continuation=(40, 41, 42, EOS)
    )
    result = run_scenario(Scenario("anchors", config, (first, second)), SimBackend())
    assert result.ok, result.violations
    return result


def _received(result: RunResult, uid: int, kind: str = "user") -> int:
    return next(m.step for m in result.trace.received if m.uid == uid and m.kind == kind)


def _forwards(result: RunResult, uid: int) -> list[tuple[int, int | None]]:
    """(iteration, batch) of each forward that held `uid`, before request 1 came."""
    return [
        (op.step, op.batch) for op in result.trace.ops if op.kind == "forward" and uid in op.uids
    ]


def _read_step(result: RunResult, batch: int | None) -> int:
    return next(
        op.step for op in result.trace.ops if op.kind == "read_output" and op.batch == batch
    )


def _finished_step(result: RunResult, uid: int) -> int:
    return next(m.step for m in result.trace.messages if m.uid == uid and m.finished)


def _anchored(at: str, iterations: int = 0, uid: int = 1) -> RequestSpec:
    return RequestSpec(uid, (5, 6, 7), max_tokens=2, arrival_after=Anchor(0, at, iterations))


@pytest.mark.parametrize("loop", LOOPS)
def test_first_chunk_lands_while_the_prompt_is_still_being_prefilled(loop: LoopKind) -> None:
    result = _run(loop, _anchored("first-chunk"))
    forwards = _forwards(result, 0)
    got = _received(result, 1)
    assert got == forwards[0][0] + 1
    assert forwards[1][0] >= got  # the second chunk is launched after the arrival


@pytest.mark.parametrize("loop", LOOPS)
def test_last_launch_lands_before_the_last_result_is_processed(loop: LoopKind) -> None:
    result = _run(loop, _anchored("last-launch"))
    got = _received(result, 1)
    # The 4th sampling round (the scripted EOS) is the last: prompt 20 in chunks of 8, then 3
    # decodes. Its forward is the 6th that held request 0.
    last = _forwards(result, 0)[5]
    assert got == last[0] + 1
    if loop == "overlap":  # launched in one iteration, processed in the next: the window
        assert _read_step(result, last[1]) == got
        assert _finished_step(result, 0) == got
    else:
        assert _finished_step(result, 0) == got - 1


@pytest.mark.parametrize("loop", LOOPS)
def test_finished_lands_before_the_extra_round_is_processed(loop: LoopKind) -> None:
    result = _run(loop, _anchored("finished"))
    got = _received(result, 1)
    assert got == _finished_step(result, 0) + 1
    last = _forwards(result, 0)[-1]
    if loop == "overlap":  # the extra round: launched with the EOS's processing, read after
        assert len(_forwards(result, 0)) == 7
        assert _read_step(result, last[1]) == got
    else:
        assert _read_step(result, last[1]) == got - 1


@pytest.mark.parametrize("loop", LOOPS)
def test_extra_round_lands_right_after_the_deferred_cleanup(loop: LoopKind) -> None:
    result = _run(loop, _anchored("extra-round"))
    last = _forwards(result, 0)[-1]
    assert _received(result, 1) == _read_step(result, last[1]) + 1


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("iterations", [1, 2])
def test_an_offset_moves_the_arrival_by_that_many_iterations(
    loop: LoopKind, iterations: int
) -> None:
    base = _received(_run(loop, _anchored("finished")), 1)
    assert _received(_run(loop, _anchored("finished", iterations)), 1) == base + iterations


@pytest.mark.parametrize("loop", LOOPS)
def test_abort_lands_in_the_same_receive_right_after_the_abort(loop: LoopKind) -> None:
    first = RequestSpec(0, tuple(range(10, 30)), max_tokens=8, abort_iteration=4)
    result = _run(loop, _anchored("abort", uid=0), first)  # the uid comes back at once
    received = [(m.step, m.uid, m.kind) for m in result.trace.received]
    assert received[-2:] == [(4, 0, "abort"), (4, 0, "user")]
    assert [o.finish_reason for o in result.outcomes] == ["abort", "length"]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_abort_anchored_to_its_own_last_launch_meets_the_result_in_flight(
    loop: LoopKind,
) -> None:
    first = RequestSpec(
        0,
        tuple(range(10, 30)),
        max_tokens=3,
        ignore_eos=True,
        abort_after=Anchor(0, "last-launch"),
    )
    result = _run(loop, RequestSpec(1, (5, 6), max_tokens=1, arrival=1.0), first)
    abort = _received(result, 0, "abort")
    last = _forwards(result, 0)[-1]
    assert abort == last[0] + 1
    expected = "abort" if loop == "overlap" else "length"  # normal: processed before the abort
    assert result.outcomes[0].finish_reason == expected


def test_a_point_never_reached_falls_back_to_the_end() -> None:
    first = RequestSpec(0, tuple(range(10, 30)), max_tokens=8, abort_iteration=1)
    result = _run("overlap", _anchored("finished"), first)
    assert _received(result, 1) == 1  # aborted at the receive of iteration 1: ended there


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("at", ["first-chunk", "finished", "extra-round", "abort"])
def test_a_message_anchored_to_a_late_request_waits_for_its_arrival_time(
    loop: LoopKind, at: str
) -> None:
    """Request 0 arrives late (50 ms: more idle iterations than the liveness bound), request 1
    is anchored to it. The idle host sleeps until request 0's time, as with nothing anchored;
    before, the anchored message (due 'by iterations') made it poll in place until the bound, a
    false `liveness` ("not idle after 98 iterations; requests [] remain", first from vLLM)."""
    first = RequestSpec(0, (3,), max_tokens=1, arrival=0.05)
    result = _run(loop, _anchored(at), first)
    assert [o.finish_reason for o in result.outcomes] == ["length", "length"]
    assert _received(result, 0) <= 2  # one idle wait, not one poll per idle iteration


def test_a_scenario_file_names_an_anchor_and_round_trips() -> None:
    data = {
        "config": {"num_slots": 2},
        "requests": [
            {"uid": 0, "prompt": [3, 4, 5]},
            {"uid": 0, "prompt": [6], "arrival_after": {"request": 0, "at": "finished"}},
        ],
    }
    scenario = scenario_from_dict(data)
    assert scenario.requests[1].arrival_after == Anchor(0, "finished", 0)
    assert scenario_from_dict(scenario.to_json()) == scenario


@pytest.mark.parametrize(
    ("anchor", "words"),
    [
        ({"request": 1, "at": "finished"}, "earlier request"),
        ({"request": 0, "at": "done"}, "'at' must be one of"),
        ({"request": 0, "at": "finished", "iterations": -1}, "'iterations' must be >= 0"),
        ({"request": 0}, "needs 'request' and 'at'"),
        ({"request": 0, "at": "finished", "when": 1}, "unknown field when"),
    ],
)
def test_a_bad_anchor_is_one_clear_error(anchor: dict[str, object], words: str) -> None:
    data = {
        "config": {},
        "requests": [{"uid": 0, "prompt": [3]}, {"uid": 1, "prompt": [4], "arrival_after": anchor}],
    }
    with pytest.raises(ScenarioError, match=words):
        scenario_from_dict(data)


# Each window mutant (bench/mutants.py) against the anchored case that opens its window: found
# under overlap, where the window exists; the normal loop processes each round before the next.
_WINDOW_CASES = {
    "result-by-uid": ("finished", "oracle"),
    "uid-busy-until-released": ("finished", "exact-length"),
    "release-by-uid": ("finished", "pages-conserved"),
    "abort-in-flight-completes": ("own-last-launch", "abort-silent"),
}


@pytest.mark.parametrize("mutant_id", sorted(_WINDOW_CASES))
def test_a_window_mutant_is_caught_where_its_anchor_lands(mutant_id: str, tmp_path: Path) -> None:
    factory = materialize(BY_ID[mutant_id], tmp_path).factory()
    case, invariant = _WINDOW_CASES[mutant_id]
    for loop in LOOPS:
        config = SchedulerConfig(num_slots=2, num_pages=64, max_extend_tokens=8, loop=loop)
        if case == "finished":  # the uid comes back while the extra round is in flight
            first = RequestSpec(0, tuple(range(10, 30)), max_tokens=8, continuation=(40, EOS))
            second = RequestSpec(0, (5, 6, 7), max_tokens=2, arrival_after=Anchor(0, "finished"))
        else:  # aborted while its last round is in flight
            first = RequestSpec(
                0,
                tuple(range(10, 30)),
                max_tokens=3,
                ignore_eos=True,
                abort_after=Anchor(0, "last-launch"),
            )
            second = RequestSpec(1, (5, 6), max_tokens=2, arrival=0.001)
        scenario = Scenario("window", config, (first, second))
        result = run_scenario(scenario, SimBackend(), scheduler=factory)
        found = [v.invariant for v in result.violations]
        assert found == ([invariant] if loop == "overlap" else []), (loop, found)
