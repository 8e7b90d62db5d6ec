"""Run a scenario on a backend with the invariants on, and collect what happened."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.trace import Trace
from overlapcheck.invariants.base import Invariant, InvariantViolated, Violation
from overlapcheck.invariants.registry import make_invariants
from overlapcheck.reference.scheduler import MessageSource, Scheduler
from overlapcheck.scenarios.scenario import RequestSpec, Scenario
from overlapcheck.scenarios.source import (
    IterationSource,
    WorkloadSource,
    delivery_schedule,
    user_msg,
)


class Backend(Protocol):
    """What the runner needs from a backend: a device and a sequential reference."""

    name: str

    def prepare(self, scenario: Scenario) -> Scenario:
        """The scenario as this backend runs it (the real engine fits it to its model)."""
        ...

    def make_device(self, scenario: Scenario) -> Device: ...

    def reference(self, spec: RequestSpec, max_tokens: int) -> list[int]: ...

    def token_matches(self, uid: int, position: int, token: int) -> bool: ...


@dataclass
class RunContext:
    """What invariants may read about the run besides the scheduler."""

    scenario: Scenario
    scheduler: Scheduler
    backend: Backend
    max_output: dict[int, int]
    ignore_eos: dict[int, bool]
    references: dict[int, list[int]]

    def reference_tokens(self, uid: int) -> list[int] | None:
        return self.references.get(uid)

    def token_matches(self, uid: int, position: int, token: int) -> bool:
        return self.backend.token_matches(uid, position, token)


@dataclass
class RequestOutcome:
    uid: int
    tokens: list[int]
    finish_reason: str  # length | eos | abort | rejected | unfinished

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "tokens": self.tokens, "finish_reason": self.finish_reason}


@dataclass
class RunResult:
    scenario: Scenario
    backend: str
    config: SchedulerConfig
    outcomes: list[RequestOutcome]
    violations: list[Violation]
    trace: Trace
    trace_hash: str
    iterations: int
    simulated_seconds: float
    wall_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    scheduler: Scheduler | None = None  # its final state, for tests and tools

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def deliveries(self) -> list[tuple[int, int, str]]:
        """(iteration, uid, kind) of each message as received: `run_scenario(deliveries=...)`
        replays this run's message order on another backend."""
        return [(m.step, m.uid, m.kind) for m in self.trace.received]

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "backend": self.backend,
            "scenario": self.scenario.name,
            "loop": c.loop,
            "cache": c.cache,
            "page_size": c.page_size,
            "policy": c.policy,
            "faults": sorted(c.faults),
            "ok": self.ok,
            "requests": [o.to_json() for o in self.outcomes],
            "violations": [v.to_json() for v in self.violations],
            "trace_hash": self.trace_hash,
            "stats": {
                "iterations": self.iterations,
                "simulated_seconds": self.simulated_seconds,
                "wall_seconds": self.wall_seconds,
                "operations": len(self.trace.ops),
                **self.extra,
            },
        }


def step_bound(scenario: Scenario) -> int:
    """Iterations after which a run that has not finished counts as a liveness violation."""
    cfg = scenario.config
    work = sum(
        -(-len(r.prompt) // cfg.max_extend_tokens) + r.max_tokens + 2 for r in scenario.requests
    )
    return 4 * work + 64


def run_scenario(
    scenario: Scenario,
    backend: Backend,
    invariants: Iterable[str] | None = None,
    deliveries: list[tuple[int, int, str]] | None = None,
) -> RunResult:
    """Run until idle (or the first violation) and report.

    `deliveries` ((iteration, uid, "user" | "abort") as another run received them) replaces the
    workload's arrival times: a real device replays a simulated run's message order that way.
    """
    started = time.perf_counter()
    scenario = backend.prepare(scenario)
    device = backend.make_device(scenario)
    source: MessageSource
    if deliveries is None:
        source = WorkloadSource(scenario.requests)
    else:
        source = IterationSource(delivery_schedule(scenario.requests, deliveries))
    scheduler = Scheduler(scenario.config, device, source)
    if isinstance(source, IterationSource):
        source.bind(lambda: scheduler.step_no)
    cfg = scenario.config
    live = {s.uid: s for s in scenario.requests if rejection(cfg, user_msg(s), live=False) is None}
    ctx = RunContext(
        scenario,
        scheduler,
        backend,
        max_output={u: max_output(cfg, user_msg(s)) for u, s in live.items()},
        ignore_eos={u: s.ignore_eos for u, s in live.items()},
        references={u: backend.reference(s, max_output(cfg, user_msg(s))) for u, s in live.items()},
    )
    checks = make_invariants(invariants)
    for inv in checks:
        inv.bind(ctx)
        scheduler.listeners.append(inv)
    with _fewer_collections():
        violations = _drive(scheduler, checks, step_bound(scenario))
    return RunResult(
        scenario=scenario,
        backend=backend.name,
        config=cfg,
        outcomes=outcomes(scenario, device.trace),
        violations=violations,
        trace=device.trace,
        trace_hash=device.trace.digest(),
        iterations=scheduler.step_no,
        simulated_seconds=device.now(),
        wall_seconds=time.perf_counter() - started,
        scheduler=scheduler,
    )


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """A run allocates many small objects that live until it ends (the trace), and the default
    gen-0 threshold makes the collector rescan them thousands of times. Raise it for the run."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _drive(scheduler: Scheduler, checks: list[Invariant], bound: int) -> list[Violation]:
    try:
        while scheduler.step():
            if scheduler.step_no > bound:
                stuck = tuple(sorted(scheduler.reqs))
                return [
                    Violation(
                        "liveness",
                        scheduler.step_no,
                        scheduler.device.now(),
                        stuck,
                        f"not idle after {bound} iterations; requests {list(stuck)} remain",
                    )
                ]
        for inv in checks:
            inv.finish()
    except InvariantViolated as err:
        return [err.violation]
    except InvariantError as err:  # the scheduler's own integrity checks
        return [Violation(err.invariant, scheduler.step_no, scheduler.device.now(), (), err.detail)]
    return []


def outcomes(scenario: Scenario, trace: Trace) -> list[RequestOutcome]:
    """Each request's tokens and finish reason, from the messages (uids in workload order)."""
    tokens: dict[int, list[int]] = {}
    reason: dict[int, str] = {}
    eos = scenario.config.eos_token_id
    specs = {s.uid: s for s in scenario.requests}
    for m in trace.messages:
        if m.kind == "reject":
            reason[m.uid] = "rejected"
            continue
        tokens.setdefault(m.uid, []).append(m.token)
        if m.finished and m.uid not in reason:
            hit_eos = m.token == eos and not specs[m.uid].ignore_eos
            reason[m.uid] = "eos" if hit_eos else "length"
    out = []
    seen: set[int] = set()
    for spec in scenario.requests:
        if spec.uid in seen:
            continue
        seen.add(spec.uid)
        r = reason.get(spec.uid)
        if r is None:
            r = "abort" if spec.abort_at is not None else "unfinished"
        out.append(RequestOutcome(spec.uid, tokens.get(spec.uid, []), r))
    return out
