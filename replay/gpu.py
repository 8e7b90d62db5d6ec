"""Replay a simulator counterexample on a real device, forcing the order that made it fail.

The counterexample's workload runs on the real engine (prompt ids mapped into the model's
vocabulary, stop tokens taken from the reference's own greedy output), every message delivered at
the iteration the simulator delivered it. Where the simulator's run shows a race, a gate forces
its order on the device (`replay/plan.py`); otherwise each operation the simulator
delayed gets the same delay before it: `torch.cuda._sleep` on its stream, a host sleep in its host
phase. Every invariant is checked on the real run; `no-race` runs over the real footprints after
the run, so that a race that corrupted data is also seen as what it did (a wrong token, say):
that is "manifested". A fix is replayed under the same plan as the fault it fixes.

A speculative counterexample's schedule follows how many drafts each step accepted, which the
engine's model decides: the scheduler then drafts with `ReplayDrafts`, which proposes the
engine's own tokens exactly as far as the simulator's step accepted
(`replay/drafts.py`), so the replay takes the recorded steps and its gates find
their ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlapcheck.backends.gates import GateOutcome
from overlapcheck.backends.gpu.backend import TorchBackend
from overlapcheck.backends.gpu.device import DevicePlan
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.no_race import NoRace
from overlapcheck.invariants.races import RaceDetector
from overlapcheck.reference.drafter import PromptLookup
from overlapcheck.replay.drafts import (
    DraftLog,
    ReplayDrafts,
    Rows,
    compare,
    recorded_steps,
)
from overlapcheck.replay.plan import ReplayPlan, plan_replay
from overlapcheck.replay.sim import replay_on_sim


@dataclass
class Verdict:
    repeat: int
    reproduced: bool  # the counterexample's invariant was violated
    manifested: list[str]  # invariants other than no-race that failed (what the race did)
    race: str | None  # the race the footprints show, if any
    applied: int  # planned sleeps that found their operation
    missed: int
    gates: list[GateOutcome]
    drafts: str = ""  # speculative replays: how the verify steps followed the record
    off_record: int = 0  # speculative replays: verify steps unlike the recorded ones

    @property
    def clean(self) -> bool:
        """No invariant failed and the footprints show no race."""
        return not self.manifested and self.race is None

    def to_json(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "reproduced": self.reproduced,
            "manifested": self.manifested,
            "race": self.race,
            "applied": self.applied,
            "missed": self.missed,
            "gates": [g.to_json() for g in self.gates],
            **({"drafts": self.drafts} if self.drafts else {}),
        }

    def gate_line(self) -> str:
        return "; ".join(f"gate {i + 1} {g.line()}" for i, g in enumerate(self.gates))


def replay_once(
    cex: Counterexample,
    backend: TorchBackend,
    plan: ReplayPlan,
    deliveries: list[tuple[int, int, str]],
    repeat: int,
    drafts: Drafts | None = None,
) -> tuple[Verdict, RunResult]:
    planned = backend.planned(DevicePlan(tuple(plan.sleeps), plan.gates))
    drafter = drafts.fresh() if drafts is not None else None
    # Every violation (keep going): the verdict asks whether the recorded one manifested.
    checks = [i for i in cex.invariants if i != NoRace.id]
    result = run_scenario(
        cex.scenario,
        planned,
        checks,
        deliveries=deliveries,
        scheduler=cex.scheduler,
        keep_going=True,
        drafter=drafter,
    )
    gates: list[GateOutcome] = []
    if backend.device is not None:
        backend.device.finish()
        gates = backend.device.gate_outcomes()
    race = RaceDetector().check(result.trace)
    race_line = None
    if race is not None:
        first, second = result.trace.ops[race.first], result.trace.ops[race.second]
        race_line = (
            f"{race.kind} on {race.buffer}: {first.agent} `{first.label}` vs "
            f"{second.agent} `{second.label}`"
        )
    failed = [v.invariant for v in result.violations]
    reproduced = cex.invariant in failed or (cex.invariant == NoRace.id and race is not None)
    injector = backend.device.injector if backend.device is not None else None
    applied = len(injector.applied) if injector is not None else 0
    missed = len(injector.missed) if injector is not None else len(plan.sleeps)
    said, off = "", 0
    if drafts is not None:
        match = compare(drafts.steps, result.trace.verified)
        said, off = match.line(), match.differ
    verdict = Verdict(repeat, reproduced, failed, race_line, applied, missed, gates, said, off)
    return verdict, result


class Drafts:
    """A speculative replay's drafts: the recorded steps and the rows they draft from, a fresh
    `ReplayDrafts` for each run."""

    def __init__(
        self,
        recorded: RunResult,
        backend: TorchBackend,
        scenario_of: Counterexample,
        planned: dict[tuple[int, int], int],
    ) -> None:
        greedy = backend.oracle.greedy if backend.oracle is not None else None
        if greedy is None:
            raise ValueError("a speculative replay drafts from the oracle: the backend has none")
        prepared = backend.prepare(scenario_of.scenario)
        self.steps = recorded_steps(recorded.trace.verified)
        self.rows = Rows.of(prepared, greedy)
        self.vocab = prepared.config.vocab_size
        self.planned = planned

    def rows_from(self, result: RunResult) -> None:
        self.rows.learn(result)

    def fresh(self) -> ReplayDrafts:
        return ReplayDrafts(self.steps, self.rows, self.vocab, self.planned)


def speculative_record(cex: Counterexample, backend: TorchBackend) -> tuple[RunResult, Drafts]:
    """The simulator's whole run of a speculative counterexample (past its first violation, as
    the real run goes on) and the drafts that reproduce its acceptance. The reference's drafts
    are logged too: a step planned and not launched still decided the pages it would take."""
    log = DraftLog(PromptLookup()) if cex.scheduler.is_reference else None
    recorded = replay_on_sim(cex, keep_going=True, drafter=log)
    return recorded, Drafts(recorded, backend, cex, log.drafted if log is not None else {})


MARGINS = (3.0, 2.0, 1.5, 1.0)


def scaled(cex: Counterexample, margin: float) -> Counterexample:
    """The counterexample with every timing draw multiplied by `margin`."""
    timing = cex.data.get("timing", {})
    draws = {k: v * margin for k, v in timing.get("draws", {}).items()}
    return Counterexample({**cex.data, "timing": {**timing, "draws": draws}}, cex.where)


def with_margin(cex: Counterexample) -> tuple[Counterexample, float]:
    """The counterexample with its delays scaled up as far as the simulator still shows the same
    violation. Shrinking leaves each delay at the least that fails in the simulator, a knife edge
    that real timing noise falls off; a larger delay that still fails there is a sturdier replay."""
    for margin in MARGINS:
        bigger = scaled(cex, margin)
        if margin == 1.0 or bigger.reproduced(replay_on_sim(bigger)) is not None:
            return bigger, margin
    return cex, 1.0


def replay_verdicts(
    cex: Counterexample,
    backend: TorchBackend,
    repeat: int,
    under_test: Counterexample | None = None,
) -> tuple[ReplayPlan, list[Verdict]]:
    """The counterexample's replay plan (gates, or delays with margin), and one verdict per
    repeat on `backend` after a warm-up. `under_test` (the fix: the same file with the fault
    off or another scheduler) runs under `cex`'s plan instead of `cex` itself."""
    cex, margin = with_margin(cex)
    sim = replay_on_sim(cex)
    plan = plan_replay(sim.trace, backend.gates_unavailable() if backend.name == "cuda" else None)
    run, recorded = cex, sim
    if under_test is not None:
        run = scaled(under_test, margin)
        recorded = replay_on_sim(run)  # the fix's own message iterations
    drafts = None
    if run.scenario.config.draft_tokens:
        recorded, drafts = speculative_record(run, backend)
    deliveries = recorded.deliveries
    # A warm-up run, not judged and without gates: a workload's first run compiles and caches
    # (new batch shapes, kernels loaded), so its host phases run long and move the very ordering
    # a sleep sets up, and loading a kernel may wait for a spinning gate. A speculative replay
    # takes the engine's own tokens from it where they differ from the reference's at a tie.
    _, warm = replay_once(run, backend, plan.without_gates(), deliveries, -1, drafts)
    if drafts is not None:
        drafts.rows_from(warm)
    verdicts = [replay_once(run, backend, plan, deliveries, i, drafts)[0] for i in range(repeat)]
    return plan, verdicts
