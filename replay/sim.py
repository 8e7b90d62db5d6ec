"""Replay a counterexample on the simulator: the recorded scenario, timing draws and checks."""

from __future__ import annotations

from typing import Literal, NamedTuple

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.speculative import Drafter
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.base import Violation


def replay_on_sim(
    cex: Counterexample,
    scheduler: SchedulerSpec | None = None,
    hang_timeout: float | None = None,
    keep_going: bool = False,
    drafter: Drafter | None = None,
) -> RunResult:
    """Run `cex` as recorded, with the recorded scheduler unless `scheduler` overrides it, and
    the recorded watchdog timeout unless `hang_timeout` does (0: off); to the end of the run
    with `keep_going` (the trace up to the first violation is the same); `drafter`: the
    speculative scheduler's, where it takes one (to log what it drafted)."""
    timeout = cex.hang_timeout if hang_timeout is None else hang_timeout
    return run_scenario(
        cex.scenario,
        SimBackend(cex.timing()),
        cex.invariants,
        scheduler=scheduler or cex.scheduler,
        hang_timeout=0 if timeout is None else timeout,
        keep_going=keep_going,
        drafter=drafter,
    )


# Ranks whose order follows object addresses (a `set` of objects) diverge by those addresses,
# which differ from process to process: such a finding replays, but not always with one trace.
ADDRESS_DEPENDENT = "rank-consistent"
ADDRESS_NOTE = (
    "ranks that diverge may order by object addresses (a set of objects), which differ from "
    "run to run, so their replays need not repeat the same trace"
)


class Judgement(NamedTuple):
    """What a simulator replay says about a counterexample.

    `kind`: `reproduced` (the recorded invariant fired: exactly, with the same trace, when
    nothing changed), `fixed` (nothing fires, and something on the user's side changed: the fix
    holds), `other` (another invariant fires, after a change), or `differs` (the trace or the
    violation differs although nothing the file records changed: nondeterminism in the
    scheduler, or a bug of overlapcheck's; or nothing fires where only overlapcheck's own code
    changed, which cannot tell a fix). `changed`: what differs from the recording, one phrase
    each (the scheduler named, its code, the faults, overlapcheck's own code). `files`: the
    scheduler's files that changed, relative to their roots.
    """

    kind: Literal["reproduced", "fixed", "other", "differs"]
    hit: Violation | None
    same_trace: bool
    changed: tuple[str, ...]
    files: tuple[str, ...] = ()


def judge(
    cex: Counterexample,
    result: RunResult,
    scheduler: SchedulerSpec | None = None,
    faults_off: bool = False,
    ranks: int | None = None,
) -> Judgement:
    """Compare a replay (`replay_on_sim(cex, scheduler)`, of `cex.without_faults()` when
    `faults_off`) with what `cex` recorded."""
    changed: list[str] = []
    files: list[str] = []
    if scheduler is not None and scheduler != cex.scheduler:
        changed.append(f"the scheduler is {scheduler.text}, not the recorded {cex.scheduler.text}")
    else:
        now = cex.scheduler.fingerprint(result.scheduler) if cex.code is not None else None
        files = cex.code_changes(now) or []
        if files:
            moved = cex.code.commits_moved(now) if cex.code is not None and now else []
            checkout = f" (checkout {'; '.join(moved)})" if moved else ""
            changed.append(f"the scheduler's code changed: {', '.join(files)}{checkout}")
    if ranks is not None and ranks != cex.scenario.config.num_ranks:
        changed.append(f"{ranks} rank(s), not the recorded {cex.scenario.config.num_ranks}")
    if faults_off and cex.scenario.config.faults:
        changed.append(f"the faults are off ({', '.join(sorted(cex.scenario.config.faults))})")
    hit = cex.reproduced(result)
    same = result.trace_hash == cex.trace_hash
    if hit is not None and not same and not changed and hit.invariant == ADDRESS_DEPENDENT:
        changed.append(ADDRESS_NOTE)  # the same divergence: its order is the addresses'
    # A change of overlapcheck's own explains a different trace, but never makes a fix: only a
    # change on the user's side (the scheduler, its code, the faults, the ranks) can be one.
    ours = cex.checker_change() if not same or hit is None else None
    kind: Literal["reproduced", "fixed", "other", "differs"]
    if hit is not None:
        kind = "reproduced" if same or changed or ours else "differs"
    elif changed:
        kind = "other" if result.violations else "fixed"
    else:
        kind = "other" if ours and result.violations else "differs"
    if ours:
        changed.append(ours)
    return Judgement(kind, hit, same, tuple(changed), tuple(files))
