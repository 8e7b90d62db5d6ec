"""The order of launches and result processing, as the two loops define it."""

from __future__ import annotations

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import run_scenario


def one_request_log(loop: str) -> list[tuple[str, int]]:
    """Launches (forwards issued) and processing (the host reading a batch's tokens), in the
    order the host issued them."""
    scenario = Scenario(
        "three", SchedulerConfig(loop=loop), (RequestSpec(0, (5, 6, 7), max_tokens=3),)
    )
    trace = run_scenario(scenario, SimBackend()).trace
    names = {"forward": "launch", "read_output": "process"}
    return [(names[op.kind], op.batch or 0) for op in trace.ops if op.kind in names]


@pytest.mark.parametrize(
    ("loop", "expected"),
    [
        (
            "normal",
            [
                ("launch", 1),
                ("process", 1),
                ("launch", 2),
                ("process", 2),
                ("launch", 3),
                ("process", 3),
            ],
        ),
        (
            "overlap",
            [
                ("launch", 1),
                ("launch", 2),
                ("process", 1),
                ("launch", 3),
                ("process", 2),
                ("process", 3),
            ],
        ),
    ],
)
def test_one_request_three_tokens(loop: str, expected: list[tuple[str, int]]) -> None:
    assert one_request_log(loop) == expected


def test_overlap_launches_next_forward_before_processing_on_the_trace() -> None:
    scenario = Scenario("three", SchedulerConfig(), (RequestSpec(0, (5, 6, 7), max_tokens=3),))
    trace = run_scenario(scenario, SimBackend()).trace
    forwards = [op for op in trace.ops if op.kind == "forward"]
    reads = [op for op in trace.ops if op.kind == "read_output"]
    # Batch 2's forward is issued (and starts on the engine) before the host reads batch 1.
    assert forwards[1].seq < reads[0].seq
    assert forwards[1].start is not None and reads[0].issue is not None
    assert forwards[1].start <= reads[0].issue
