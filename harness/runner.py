"""The harness: run a scenario with a scheduler under test on a backend, invariants on, and report.

The harness owns what it can see for any scheduler: it wraps the message source (every message
handed over is recorded with its iteration) and the sink (every message sent is recorded and
checked), counts iterations, and tells a crash of the scheduler (a finding, `no-crash`) from a
crash of overlapcheck itself (`CheckerBug`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from overlapcheck.backends.base import Backend, KeepsKvShadow
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.capability import provides
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import UserError
from overlapcheck.core.expected import Expected
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.messages import UserMsg
from overlapcheck.core.protocol import SchedulerFactory, SchedulerUnderTest
from overlapcheck.core.ranks import RankLog
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.scenario import RequestSpec, Scenario, user_msg
from overlapcheck.core.speculative import Drafter, TakesDrafter
from overlapcheck.core.trace import Trace
from overlapcheck.harness.rank_processes import in_this_process, start_others
from overlapcheck.harness.ranks import Broadcast, Lockstep, OtherRank, build_others
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.stepping import Checks, Harness, Workload, check_after, drive
from overlapcheck.harness.watchdog import Watchdog
from overlapcheck.invariants.base import Invariant, Violation
from overlapcheck.invariants.context import Request, RunContext
from overlapcheck.invariants.registry import make_invariants
from overlapcheck.scenarios.source import WorkloadSource


@dataclass
class RequestOutcome:
    uid: int
    tokens: list[int]
    finish_reason: str  # length | eos | abort | rejected | unfinished
    reason: str = ""  # why it was rejected


@dataclass
class RunResult:
    scenario: Scenario
    backend: str
    config: SchedulerConfig
    outcomes: list[RequestOutcome]
    violations: list[Violation]
    trace: Trace
    iterations: int
    simulated_seconds: float
    wall_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    scheduler: Any = None  # its final state, for tests and tools
    notices: list[str] = field(default_factory=list)  # checks skipped, and why
    requests: list[Request] = field(default_factory=list)  # every request instance received
    checks: list[Invariant] = field(default_factory=list)  # the invariants, with what they saw
    hang_timeout: float | None = None  # the watchdog's, in wall-clock seconds (None: off)

    @property
    def ok(self) -> bool:
        return not self.violations

    @cached_property
    def trace_hash(self) -> str:
        """The trace's digest, computed when first asked for: a search's passing examples never
        need it, and at about 40 µs per iteration it was the largest single cost of a run that
        nothing reads."""
        return self.trace.digest()

    @property
    def deliveries(self) -> list[tuple[int, int, str]]:
        """(iteration, uid, kind) of each message as received: `run_scenario(deliveries=...)`
        replays this run's message order on another backend."""
        return [(m.step, m.uid, m.kind) for m in self.trace.received]


def step_bound(scenario: Scenario) -> int:
    """Iterations after which a run that has not finished counts as a liveness violation."""
    cfg = scenario.config
    work = sum(
        -(-scenario.prompt_bound(i) // cfg.max_extend_tokens) + r.max_tokens + 2
        for i, r in enumerate(scenario.requests)
    )
    return 4 * work + 64 + scenario.last_iteration()


def run_scenario(
    scenario: Scenario,
    backend: Backend,
    invariants: Iterable[str] | None = None,
    deliveries: list[tuple[int, int, str]] | None = None,
    scheduler: SchedulerSpec | SchedulerFactory | None = None,
    keep_going: bool = False,
    defer_checks: bool | None = None,
    hang_timeout: float | None = None,
    deadline: float | None = None,
    drafter: Drafter | None = None,
) -> RunResult:
    """Run until idle (or the first violation; every violation with `keep_going`) and report.

    `scheduler`: the scheduler under test, as a spec or a factory (None: the reference).
    `deliveries` ((iteration, uid, "user" | "abort") as another run received them) replaces the
    workload's arrival times: a real device replays a simulated run's message order that way.
    `defer_checks` (default: on a real engine) runs the checks that read only the trace and the
    messages after the run, over the recorded events: their host time would otherwise stretch
    the host's iterations and move the timing under test (a GPU replay's race would not land).
    `hang_timeout`: wall-clock seconds one `step()` may take before it is the finding `no-hang`
    (default: `DEFAULT_HANG_TIMEOUT` on the simulator; off on a real engine, whose first forward
    compiles for tens of seconds; 0: off). `deadline` (`time.monotonic()`): a search's end, past
    which a running step is stopped with `DeadlineReached`. `drafter`: the drafts a speculative
    scheduler proposes, for one that takes a drafter (`TakesDrafter`; a replay's, say).
    """
    started = time.perf_counter()
    scenario = backend.prepare(scenario)
    cfg = scenario.config
    chosen = make_invariants(invariants)
    shadow: KvShadow | None = None
    if any(inv.needs_kv_shadow for inv in chosen) and provides(backend, KeepsKvShadow):
        shadow = KvShadow(cfg.num_cells, cfg.max_seq_len)
        device = cast(KeepsKvShadow, backend).make_shadowed_device(scenario, shadow)
    else:
        device = backend.make_device(scenario)
    if cfg.num_ranks > 1:
        device.trace.launches = []  # what rank-consistent compares (core/ranks.py)
    defer = not backend.checks_online if defer_checks is None else defer_checks
    # A check that reads the books reads live state, so it never waits for the end of the run.
    later = [inv for inv in chosen if defer and inv.deferrable and not inv.needs_books]
    judged = frozenset(inv.id for inv in chosen)
    checks = Checks([inv for inv in chosen if inv not in later], keep_going, judged)
    under_test = SchedulerSpec.of(scheduler)
    ctx = RunContext(scenario, device, backend.name, None, shadow)
    ctx.repeats = checks.repeats
    source: Workload = WorkloadSource(
        scenario.requests, deliveries, cfg, device.trace, lambda: ctx.step
    )
    if cfg.num_ranks > 1:  # rank 0 receives, the others get what it got (harness/ranks.py)
        source = broadcast = Broadcast(source, lambda: ctx.step)
    wanted = any(inv.id == "oracle" for inv in checks.checks)
    harness = Harness(ctx, checks, source, _oracle(scenario, backend, wanted))
    if later:
        harness.log = []
    sched = under_test.build(cfg, device, harness, harness.send, scenario)
    ctx.scheduler = sched
    stepped: SchedulerUnderTest = sched
    if cfg.num_ranks > 1:
        stepped, others = _ranks(sched, under_test, backend, scenario, ctx, broadcast)
    if drafter is not None:
        if provides(sched, TakesDrafter):
            cast(TakesDrafter, sched).use_drafter(drafter)
        else:
            ctx.notices.append(
                "the scheduler takes no drafter (core/speculative.py, TakesDrafter): it drafts "
                "its own way, so a speculative replay may leave the recorded schedule"
            )
    for inv in checks.checks:
        inv.bind(ctx)
    skipped = [inv for inv in checks.checks if inv.needs_books and not ctx.has_books]
    if skipped:
        ctx.notices.append(
            f"skipped {', '.join(inv.id for inv in skipped)}: the scheduler has no books() "
            "(see core/protocol.py); the black-box checks still run"
        )
        checks.checks = [inv for inv in checks.checks if inv not in skipped]
    with _fewer_collections(backend.small_run_objects and not device.holds_program_tensors):
        watchdog = Watchdog(hang_timeout_for(backend, hang_timeout), deadline)
        completed = drive(stepped, ctx, checks, step_bound(scenario), harness.log, watchdog)
    violations, notices = checks.violations, ctx.notices
    if later:
        assert harness.log is not None
        oracle = _oracle(scenario, backend, any(inv.id == "oracle" for inv in later))
        late, late_notices = check_after(later, harness.log, ctx, keep_going, oracle, completed)
        # At one step the deferred (message-time) checks come first, as they would online.
        violations = sorted(late + violations, key=lambda v: v.step)
        violations = violations if keep_going else violations[:1]
        notices = notices + [n for n in late_notices if n not in notices]
    ctx.detach()
    device.close()
    extra: dict[str, Any] = {}
    if cfg.num_ranks > 1:
        extra["ranks"] = ctx.ranks  # each rank's launches and decisions, rank 0's first
        extra["rank_traces"] = [device.trace] + [rank.close() for rank in others]
    return RunResult(
        scenario=scenario,
        backend=backend.name,
        config=cfg,
        outcomes=outcomes(ctx),
        violations=violations,
        trace=device.trace,
        iterations=ctx.step,
        simulated_seconds=device.now(),
        wall_seconds=time.perf_counter() - started,
        scheduler=sched,
        notices=notices,
        requests=ctx.ledger.requests,
        checks=checks.checks + later,
        hang_timeout=watchdog.timeout,
        extra=extra,
    )


def _ranks(
    sched: SchedulerUnderTest,
    under_test: SchedulerSpec,
    backend: Backend,
    scenario: Scenario,
    ctx: RunContext,
    broadcast: Broadcast,
) -> tuple[Lockstep, Sequence[OtherRank]]:
    """The other ranks of a run of several, each in a process of its own where it can be
    (harness/rank_processes.py), and what steps them all (harness/ranks.py)."""
    if backend.name != "sim":
        raise UserError(
            f"--ranks {scenario.config.num_ranks} runs on the simulator only (--backend sim)"
        )
    assert ctx.device.trace.launches is not None
    step = lambda: ctx.step  # noqa: E731
    count = scenario.config.num_ranks
    others: Sequence[OtherRank]
    why = in_this_process(under_test, backend)
    if why is None:
        others = start_others(count, under_test, cast(SimBackend, backend), scenario, broadcast)
    else:
        ctx.notices += [why] if why else []
        others = build_others(count, under_test, backend, scenario, broadcast, step)
    lead_log = RankLog(0, ctx.device.trace.launches)
    ctx.ranks = [lead_log] + [r.log for r in others]
    return Lockstep(sched, lead_log, others, step), others


# Wall-clock seconds a simulated step may take: a step of the largest configuration a run can
# hold takes about a second on a loaded 2-core machine, an ordinary one a millisecond.
DEFAULT_HANG_TIMEOUT = 5.0


def hang_timeout_for(backend: Backend, asked: float | None) -> float | None:
    """The watchdog's timeout: `asked`, else the default on the simulator (0 turns it off)."""
    if asked is None:
        return DEFAULT_HANG_TIMEOUT if backend.watchdog_by_default else None
    return asked or None


def _oracle(
    scenario: Scenario, backend: Backend, wanted: bool
) -> Callable[[UserMsg, int], Expected | None]:
    """Each request's expected output, computed before the run for the workload's requests: a
    real engine's oracle must not run between iterations (it would stall the host mid-run and
    move the very timing a replay sets up). Only a message the workload could not list (a
    follow-up, whose prompt grows from what was sent) gets one on receipt. None at all when no
    check reads them."""
    by_msg: dict[UserMsg, list[RequestSpec]] = {}
    for spec in scenario.requests:
        if spec.after is None:  # a follow-up's prompt is known when it is sent: built from msg
            by_msg.setdefault(user_msg(spec), []).append(spec)
    ready: dict[tuple[RequestSpec, int], Expected] = {}
    if wanted:
        for msg, specs in by_msg.items():
            if rejection(scenario.config, msg, live=False) is None:
                ready[(specs[0], max_output(scenario.config, msg))] = backend.expected(
                    specs[0], max_output(scenario.config, msg)
                )

    def expected(msg: UserMsg, limit: int) -> Expected | None:
        if not wanted:
            return None
        specs = by_msg.get(msg)
        spec = (
            specs[0]
            if specs
            else RequestSpec(
                msg.uid,
                msg.input_ids,
                msg.sampling_params.max_tokens,
                ignore_eos=msg.sampling_params.ignore_eos,
            )
        )
        # Each precomputed one serves one request: a real engine's judges token by token
        # (teacher forcing) and keeps state. A repeat of the same message gets a fresh one.
        found = ready.pop((spec, limit), None)
        return found if found is not None else backend.expected(spec, limit)

    return expected


# Objects the interpreter itself keeps frozen: Python 3.12 starts with a few hundred constant
# tuples there (3.11 with none). The first run thaws them into the oldest generation, where they
# live for ever like any module's constants; a caller that froze nothing leaves 0 or this count.
_FROZEN_AT_START = gc.get_freeze_count()


@contextmanager
def _fewer_collections(move_out: bool) -> Iterator[None]:
    """A run allocates many small objects that live until it ends (the trace), and the default
    gen-0 threshold makes the collector rescan them thousands of times. Raise it for the run.

    With `move_out`, at the end the run's objects go straight to the oldest generation (freeze,
    then unfreeze) before the threshold comes back: restored over tens of thousands of young
    objects, it set off a collection that scanned them all, and now and then a full one (12% of a
    search's time). They die by reference count when the caller drops the result: the run
    breaks its own cycles at its end (`RunContext.detach`, `Device.close`); one of a user's
    scheduler waits for the next full collection, like any long-lived garbage. That suits the
    simulator's runs, whose objects are small. A real engine's hold device memory (its KV pool,
    the attention kernels' workspaces) in such cycles: left young, they are freed by the
    collections of the next few runs, where the oldest generation kept them until the H200 ran
    out of memory in the CUDA suite. So they stay young (`move_out` False), and so do those of a
    run on the simulated CUDA (`Device.holds_program_tensors`): mini-sglang's objects hold its
    tensors (host memory there) in cycles, and moved out, a search's process grew by about
    1.4 MB an example (5 GB after 300 s) and spent minutes collecting it all at its exit.

    The caller's collector is left as found: the threshold is restored, and when the caller has
    frozen objects of its own (`gc.freeze()` before forking workers, say) nothing is frozen or
    unfrozen here, since unfreezing would thaw theirs too."""
    old = gc.get_threshold()
    # (at most the interpreter's own: a frozen object that dies leaves the count, so a caller's
    # freeze shows as more, never as less)
    move_run_to_oldest = move_out and gc.get_freeze_count() <= _FROZEN_AT_START
    gc.set_threshold(max(old[0], 50_000), old[1], old[2])
    try:
        yield
    finally:
        if move_run_to_oldest:
            gc.freeze()
        gc.set_threshold(*old)
        if move_run_to_oldest:
            gc.unfreeze()


def outcomes(ctx: RunContext) -> list[RequestOutcome]:
    """Each request instance's tokens and finish reason, in arrival order."""
    eos = ctx.config.eos_token_id
    out = []
    for req in ctx.ledger.requests:
        if req.rejected or req.rejection is not None:
            reason = "rejected" if req.rejected else "unfinished"
        elif req.finished_step is not None:
            hit_eos = bool(req.tokens) and req.tokens[-1] == eos
            reason = "eos" if hit_eos and not req.msg.sampling_params.ignore_eos else "length"
        elif req.aborted_step is not None:
            reason = "abort"
        else:
            reason = "unfinished"
        out.append(RequestOutcome(req.uid, list(req.tokens), reason, req.reject_reason))
    return out
