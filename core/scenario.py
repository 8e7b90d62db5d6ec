"""A scenario: a scheduler configuration plus a workload."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.messages import SamplingParams, UserMsg

# A request's lifecycle points, in the order a request passes them (see `Anchor`).
POINTS = ("first-chunk", "last-launch", "finished", "extra-round", "abort")


@dataclass(frozen=True, slots=True)
class Anchor:
    """A moment tied to a lifecycle point of request `request` (an index into the workload):
    the receive of `iterations` scheduler iterations after the first receive that can see it.

    Points (each observed from the trace and the messages, so for any scheduler):
    `first-chunk` its first forward launched; `last-launch` the forward carrying its last
    sampling round (the max_output-th, or the one that samples a scripted EOS); `finished` its
    finished message; `extra-round` the host's read of the last forward that held it, once it
    ended (its deferred cleanup; the end itself when nothing was in flight); `abort` its abort
    handed over (0 iterations: in that same receive, right after the abort). A point a request
    can no longer reach once it ended (aborted first, or rejected; `abort` when the workload
    sends it none) falls back to the moment it ended.
    """

    request: int
    at: str
    iterations: int = 0

    def problem(self) -> str | None:
        if self.at not in POINTS:
            return f"'at' must be one of {', '.join(POINTS)}, got {self.at!r}"
        if self.iterations < 0:
            return "'iterations' must be >= 0"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request, "at": self.at, "iterations": self.iterations}


# A simulated clock far past this loses the resolution of the delays it adds (1e12 + 1e-6 ==
# 1e12 in floating point), and an idle scheduler steps once per iteration until a delivery
# iteration comes: both bound what a workload may ask for.
MAX_SECONDS = 1e6
MAX_ITERATION = 100_000


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. Times are simulated seconds from the start of the run.

    `continuation` scripts the toy model: after the prompt it says these tokens (put the EOS id
    in it to end the request there). `abort_at` sends an abort at that time.

    `arrival_iteration` / `abort_iteration` deliver the request / its abort at the receive of
    scheduler iteration k instead of at a time (one or the other per event, never both), so a file
    delivers at the same iterations in both loops. An abort is never sent before its request: if
    its moment has passed by then, it follows the request in the same receive.

    `arrival_after` / `abort_after` (an `Anchor`) deliver the request / its abort at a lifecycle
    point of a request (an earlier one for an arrival; an earlier one or itself for an abort),
    so it lands in the one-iteration window between that point and its deferred cleanup.

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
    arrival_after: Anchor | None = None
    abort_after: Anchor | None = None

    @property
    def timed(self) -> bool:
        """Sent at `arrival` (not at an iteration, not after another request)."""
        return self.arrival_iteration is None and self.after is None and self.arrival_after is None

    def problem(self, index: int) -> str | None:
        """Why this request cannot stand at position `index` of a workload (None: it can)."""
        if self.arrival < 0 or (self.abort_at is not None and self.abort_at < 0) or self.think < 0:
            return "times must be >= 0"
        for name in ("arrival", "abort_at", "think"):
            value = getattr(self, name)
            if value is not None and value > MAX_SECONDS:
                return f"{name} must be <= {MAX_SECONDS:g} simulated seconds, got {value:g}"
        for name in ("arrival_iteration", "abort_iteration"):
            value = getattr(self, name)
            if value is not None and value < 0:
                return f"{name} must be >= 0"
            if value is not None and value > MAX_ITERATION:
                return f"{name} must be <= {MAX_ITERATION:,}, got {value:,}"
        if self.arrival and self.arrival_iteration is not None:
            return "give 'arrival' or 'arrival_iteration', not both"
        if self.abort_at is not None and self.abort_iteration is not None:
            return "give 'abort_at' or 'abort_iteration', not both"
        anchored = self._anchor_problem(index)
        if anchored is not None:
            return anchored
        if self.after is None:
            return "'think' needs 'after'" if self.think else None
        if not 0 <= self.after < index:
            return f"'after' must name an earlier request (an index below {index})"
        if self.arrival or self.arrival_iteration is not None:
            return "a follow-up ('after') is sent when that request ends: no arrival fields"
        if self.arrival_after is not None and self.think:
            return "give 'think' or 'arrival_after', not both"
        if self.continuation:
            return "a follow-up ('after') cannot script a continuation: its prompt is not known"
        return None

    def _anchor_problem(self, index: int) -> str | None:
        if self.arrival_after is not None:
            if self.arrival or self.arrival_iteration is not None:
                return "give 'arrival', 'arrival_iteration' or 'arrival_after', not two"
            if not 0 <= self.arrival_after.request < index:
                return f"'arrival_after' must name an earlier request (an index below {index})"
        if self.abort_after is not None:
            if self.abort_at is not None or self.abort_iteration is not None:
                return "give 'abort_at', 'abort_iteration' or 'abort_after', not two"
            if not 0 <= self.abort_after.request <= index:
                return f"'abort_after' must name this request or an earlier one (0..{index})"
            if self.abort_after.request == index and self.abort_after.at == "abort":
                return "'abort_after' cannot wait for this request's own abort"
        for name in ("arrival_after", "abort_after"):
            anchor: Anchor | None = getattr(self, name)
            problem = anchor.problem() if anchor is not None else None
            if problem is not None:
                return f"{name}: {problem}"
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
        for name in ("arrival_after", "abort_after"):
            anchor = getattr(self, name)
            if anchor is not None:
                out[name] = anchor.to_json()
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
        """The latest iteration a message is keyed to (0 when none is), plus the iterations
        anchored messages wait past their points."""
        keyed = [
            k
            for r in self.requests
            for k in (r.arrival_iteration, r.abort_iteration)
            if k is not None
        ]
        anchored = sum(
            a.iterations + 1
            for r in self.requests
            for a in (r.arrival_after, r.abort_after)
            if a is not None
        )
        return max(keyed, default=0) + anchored

    def to_json(self) -> dict[str, Any]:
        cfg = {
            f: getattr(self.config, f)
            for f in SchedulerConfig.__dataclass_fields__
            if f not in ("faults", "rank", "num_ranks")  # the harness sets each rank's `rank`
        }
        if not cfg["cuda_graph_bs"]:  # off: files as before graphs were a switch
            del cfg["cuda_graph_bs"]
        else:
            cfg["cuda_graph_bs"] = list(cfg["cuda_graph_bs"])
        if self.config.num_ranks != 1:
            cfg["num_ranks"] = self.config.num_ranks
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
