"""A scenario: a scheduler configuration plus a workload."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from overlapcheck.core.config import SchedulerConfig


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. Times are simulated seconds from the start of the run.

    `continuation` scripts the toy model: after the prompt it says these tokens (put the EOS id
    in it to end the request there). `abort_at` sends an abort at that time.
    """

    uid: int
    prompt: tuple[int, ...]
    max_tokens: int = 8
    arrival: float = 0.0
    ignore_eos: bool = False
    continuation: tuple[int, ...] = ()
    abort_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uid": self.uid,
            "prompt": list(self.prompt),
            "max_tokens": self.max_tokens,
        }
        if self.arrival:
            out["arrival"] = self.arrival
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.continuation:
            out["continuation"] = list(self.continuation)
        if self.abort_at is not None:
            out["abort_at"] = self.abort_at
        return out


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    config: SchedulerConfig
    requests: tuple[RequestSpec, ...]
    description: str = ""
    tags: tuple[str, ...] = field(default=())

    def with_config(self, **changes: Any) -> Scenario:
        return replace(self, config=replace(self.config, **changes))

    def to_json(self) -> dict[str, Any]:
        cfg = {
            f: getattr(self.config, f)
            for f in SchedulerConfig.__dataclass_fields__
            if f != "faults"
        }
        return {
            "name": self.name,
            "description": self.description,
            "config": cfg,
            "requests": [r.to_json() for r in self.requests],
        }
