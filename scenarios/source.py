"""Turn a workload into the scheduler's message source: messages delivered by simulated time."""

from __future__ import annotations

from collections.abc import Callable

from overlapcheck.core.messages import AbortMsg, InMsg, SamplingParams, UserMsg
from overlapcheck.scenarios.scenario import RequestSpec


def user_msg(spec: RequestSpec) -> UserMsg:
    return UserMsg(
        spec.uid,
        spec.prompt,
        SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos),
    )


class WorkloadSource:
    """Messages sorted by time; a request arrives before an abort at the same time."""

    def __init__(self, requests: tuple[RequestSpec, ...]) -> None:
        timeline: list[tuple[float, int, int, InMsg]] = []
        for i, spec in enumerate(requests):
            timeline.append((spec.arrival, 0, i, user_msg(spec)))
            if spec.abort_at is not None:
                timeline.append((max(spec.abort_at, spec.arrival), 1, i, AbortMsg(spec.uid)))
        timeline.sort(key=lambda item: item[:3])
        self._timeline = [(t, msg) for t, _, _, msg in timeline]
        self._next = 0

    def poll(self, now: float) -> list[InMsg]:
        out = []
        while self._next < len(self._timeline) and self._timeline[self._next][0] <= now:
            out.append(self._timeline[self._next][1])
            self._next += 1
        return out

    def next_arrival(self) -> float | None:
        if self._next < len(self._timeline):
            return self._timeline[self._next][0]
        return None


class IterationSource:
    """Messages delivered at given scheduler iterations: a replay of another run's deliveries (a
    simulator counterexample on a real GPU, whose clock runs differently)."""

    def __init__(self, schedule: list[tuple[int, InMsg]]) -> None:
        self._schedule = sorted(schedule, key=lambda item: item[0])
        self._next = 0
        self._step: Callable[[], int] = lambda: 0

    def bind(self, step: Callable[[], int]) -> None:
        """Where to read the current iteration (the scheduler's `step_no`)."""
        self._step = step

    def poll(self, now: float) -> list[InMsg]:
        out = []
        while self._next < len(self._schedule) and self._schedule[self._next][0] <= self._step():
            out.append(self._schedule[self._next][1])
            self._next += 1
        return out

    def next_arrival(self) -> float | None:
        # Idle iterations are how a replay reaches the iteration of the next message.
        return 0.0 if self._next < len(self._schedule) else None


def delivery_schedule(
    requests: tuple[RequestSpec, ...], received: list[tuple[int, int, str]]
) -> list[tuple[int, InMsg]]:
    """Each (step, uid, kind) a run received, turned back into messages of the workload."""
    specs = {s.uid: s for s in requests}
    return [
        (step, user_msg(specs[uid]) if kind == "user" else AbortMsg(uid))
        for step, uid, kind in received
    ]
