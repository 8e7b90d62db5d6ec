"""Latencies of the simulated device and host: a nominal profile plus delays from a source.

A *site* is the n-th timed operation of a run (in host issue order, which is deterministic). A delay
source gives each site an extra delay; every draw is recorded so that a run can be replayed exactly.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple, Protocol, runtime_checkable

from overlapcheck.core.errors import UserError
from overlapcheck.core.units import US

# Offsets from the end of the launch phase, not durations: a calibrated GPU puts them before it.
SIGNED_FIELDS = frozenset({"forward_tail", "d2h_queued"})


class ProfileError(UserError, ValueError):
    """A timing profile that cannot be used; the message is one line that names the field."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Nominal costs in seconds. Host phases scale with `work` (requests touched).

    Stream costs are pure device time: what an operation takes once all of its work is queued. A
    forward is enqueued kernel by kernel during the host's `launch` phase, so it cannot start
    before `forward_lead` into that phase (the host work before its first kernel), nor end before
    the phase does, plus `forward_tail` (the GPU's work after the last kernel is queued, less the
    host work the phase still does after queuing it, so it may be negative): a launch-bound
    forward ends `forward_tail` after its launch phase, whatever its device time. The D2H of the
    samples is queued after the last kernel, `d2h_queued` after the phase's end (negative: before
    it), and cannot start earlier: the stream idles in between.
    """

    schedule: float = 40 * US
    schedule_per_req: float = 4 * US
    launch: float = 12 * US
    launch_per_req: float = 1 * US
    process: float = 25 * US
    process_per_req: float = 4 * US
    idle: float = 0.0
    h2d: float = 6 * US
    h2d_per_cell: float = 0.002 * US
    d2h: float = 6 * US
    kv_copy: float = 8 * US  # a KV offload or load on the transfer stream's own copy engine
    kv_copy_per_cell: float = 0.05 * US
    forward: float = 60 * US
    forward_per_token: float = 1.5 * US
    forward_per_context: float = 0.01 * US
    forward_lead: float = 0.0
    forward_tail: float = 0.0
    d2h_queued: float = 0.0

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        """A profile from field -> seconds, checked: every field known, every value a finite
        number, none negative but the two offsets (`SIGNED_FIELDS`). Raises ProfileError: a bad
        latency would otherwise surface deep inside the simulator as our own bug."""
        if not isinstance(data, dict):
            raise ProfileError(f"expected a JSON object of field -> seconds, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise ProfileError(
                f"unknown field {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return cls(**{name: _seconds(name, value) for name, value in data.items()})

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def forward_time(self, tokens: int, context: int) -> float:
        """A forward's device time (once all of its kernels are queued)."""
        return self.forward + self.forward_per_token * tokens + self.forward_per_context * context


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ProfileError(f"{name} must be finite, got {value}")
    if value < 0 and name not in SIGNED_FIELDS:
        raise ProfileError(f"{name} must be >= 0 seconds, got {value}")
    return float(value)


class DelaySource(Protocol):
    def delay(self, site: int, kind: str, nominal: float) -> float:
        """Extra seconds (>= 0) for the operation at `site`."""
        ...


@runtime_checkable
class SplitsForRanks(Protocol):
    """A delay source that gives each iteration of a rank besides rank 0 a source of its own,
    drawn from it (`harness/ranks.py`): that rank then draws its delays where it runs (in a
    process of its own: no round trip to this one per timed operation). The sites stay those of
    the one shared `Timing`, so that the draws, recorded by site, replay exactly."""

    def rank_source(self) -> DelaySource:
        """The source for one rank's iteration: picklable, drawing on its own."""
        ...


class NoDelay:
    def delay(self, site: int, kind: str, nominal: float) -> float:
        return 0.0


class SeededDelay:
    """Seeded random jitter: each site gets up to `scale` x its nominal duration extra, and now and
    then (probability `spike`) a large delay, so that rare interleavings happen."""

    def __init__(self, seed: int, scale: float = 0.5, spike: float = 0.02) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        self.spike = spike

    def delay(self, site: int, kind: str, nominal: float) -> float:
        extra = self.rng.random() * self.scale * nominal
        if self.rng.random() < self.spike:
            extra += self.rng.random() * 200 * US
        return extra


class ReplayDelay:
    """Delays recorded by an earlier run, by site; sites past the record get none."""

    def __init__(self, draws: dict[int, float]) -> None:
        self.draws = draws

    def delay(self, site: int, kind: str, nominal: float) -> float:
        return self.draws.get(site, 0.0)


class Cost(NamedTuple):
    """How long a timed operation takes, and the part of it the delay source added (recorded in
    the trace: a GPU replay injects it again)."""

    seconds: float
    delay: float


@dataclass(slots=True)
class Timing:
    profile: Profile = field(default_factory=Profile)
    source: DelaySource = field(default_factory=NoDelay)
    draws: dict[int, float] = field(default_factory=dict)  # site -> non-zero delay drawn
    sites: int = 0

    def cost(self, kind: str, nominal: float) -> Cost:
        """The cost of the next timed operation: nominal plus the source's delay."""
        site = self.sites
        self.sites += 1
        extra = self.source.delay(site, kind, nominal)
        if extra < 0:
            raise ValueError(f"negative delay {extra} at site {site}")
        if extra:
            self.draws[site] = extra
        return Cost(nominal + extra, extra)

    def host(self, phase: str, work: int) -> Cost:
        p = self.profile
        base, per = {
            "schedule": (p.schedule, p.schedule_per_req),
            "launch": (p.launch, p.launch_per_req),
            "process": (p.process, p.process_per_req),
        }.get(phase, (0.0, 0.0))
        return self.cost(phase, base + per * work)

    def h2d(self, cells: int) -> Cost:
        return self.cost("h2d", self.profile.h2d + self.profile.h2d_per_cell * cells)

    def d2h(self) -> Cost:
        return self.cost("d2h", self.profile.d2h)

    def kv_copy(self, cells: int) -> Cost:
        return self.cost("kv_copy", self.profile.kv_copy + self.profile.kv_copy_per_cell * cells)

    def forward(self, tokens: int, context: int) -> Cost:
        return self.cost("forward", self.profile.forward_time(tokens, context))
