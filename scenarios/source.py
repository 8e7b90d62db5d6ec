"""Turn a workload into the scheduler's message source: messages delivered by simulated time."""

from __future__ import annotations

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
