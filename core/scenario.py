"""A scenario: a scheduler configuration plus a workload."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import SamplingParams, UserMsg


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. Times are simulated seconds from the start of the run.

    `continuation` scripts the toy model: after the prompt it says these tokens (put the EOS id
    in it to end the request there). `abort_at` sends an abort at that time.

    `arrival_iteration` / `abort_iteration` deliver the request / its abort at the receive of
    scheduler iteration k instead of at a time (one or the other per event, never both), so a file
    delivers at the same iterations in both loops. An abort is never sent before its request: if
    its moment has passed by then, it follows the request in the same receive.

    `after` (the index of an earlier request in the workload, not a uid: uids may repeat) makes
    this a follow-up turn: it is sent `think` seconds after that request ended (finished, aborted
    or rejected: a follow-up is sent anyway, with what the earlier request got), and its prompt is
    the earlier request's full prompt + the tokens the scheduler actually sent for it + `prompt`.
    A request whose uid an earlier-listed request also uses is sent no earlier than that one.
    """

    uid: int
    prompt: tuple[int, ...]
    max_tokens: int = 8
    arrival: float = 0.0
    ignore_eos: bool = False
    continuation: tuple[int, ...] = ()
    abort_at: float | None = None
    arrival_iteration: int | None = None
    abort_iteration: int | None = None
    after: int | None = None
    think: float = 0.0

    @property
    def timed(self) -> bool:
        """Sent at `arrival` (not at an iteration, not after another request)."""
        return self.arrival_iteration is None and self.after is None

    def problem(self, index: int) -> str | None:
        """Why this request cannot stand at position `index` of a workload (None: it can)."""
        if self.arrival < 0 or (self.abort_at is not None and self.abort_at < 0) or self.think < 0:
            return "times must be >= 0"
        for name in ("arrival_iteration", "abort_iteration"):
            value = getattr(self, name)
            if value is not None and value < 0:
                return f"{name} must be >= 0"
        if self.arrival and self.arrival_iteration is not None:
            return "give 'arrival' or 'arrival_iteration', not both"
        if self.abort_at is not None and self.abort_iteration is not None:
            return "give 'abort_at' or 'abort_iteration', not both"
        if self.after is None:
            return "'think' needs 'after'" if self.think else None
        if not 0 <= self.after < index:
            return f"'after' must name an earlier request (an index below {index})"
        if self.arrival or self.arrival_iteration is not None:
            return "a follow-up ('after') is sent when that request ends: no arrival fields"
        if self.continuation:
            return "a follow-up ('after') cannot script a continuation: its prompt is not known"
        return None

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
        for name in ("arrival_iteration", "abort_iteration", "after"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.think:
            out["think"] = self.think
        return out


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    config: SchedulerConfig
    requests: tuple[RequestSpec, ...]
    description: str = ""
    tags: tuple[str, ...] = field(default=())
    # The toy model says EOS by itself with this probability at each token (decided by a hash of
    # the context, so deterministic); 0: only scripted continuations end requests early.
    eos_probability: float = 0.0

    def with_config(self, **changes: Any) -> Scenario:
        return replace(self, config=replace(self.config, **changes))

    def prompt_bound(self, index: int) -> int:
        """The longest prompt request `index` can send (a follow-up's grows with its history)."""
        spec = self.requests[index]
        if spec.after is None:
            return len(spec.prompt)
        earlier = self.requests[spec.after]
        grown = self.prompt_bound(spec.after) + earlier.max_tokens + len(spec.prompt)
        return min(grown, self.config.max_seq_len)

    def last_iteration(self) -> int:
        """The latest iteration a message is keyed to (0 when none is)."""
        keyed = [
            k
            for r in self.requests
            for k in (r.arrival_iteration, r.abort_iteration)
            if k is not None
        ]
        return max(keyed, default=0)

    def to_json(self) -> dict[str, Any]:
        cfg = {
            f: getattr(self.config, f)
            for f in SchedulerConfig.__dataclass_fields__
            if f != "faults"
        }
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "config": cfg,
        }
        if self.eos_probability:
            out["eos_probability"] = self.eos_probability
        out["requests"] = [r.to_json() for r in self.requests]
        return out


def user_msg(spec: RequestSpec, prompt: tuple[int, ...] | None = None) -> UserMsg:
    """The request's message; a follow-up's `prompt` is known only when it is sent."""
    return UserMsg(
        spec.uid,
        spec.prompt if prompt is None else prompt,
        SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos),
    )
