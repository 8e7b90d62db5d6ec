"""Replay a simulator counterexample on a real device, with the delays that made it fail.

The counterexample's workload runs on the real engine (prompt ids mapped into the model's
vocabulary, stop tokens taken from the reference's own greedy output), every message delivered at
the iteration the simulator delivered it. Each operation the simulator delayed gets the same delay
before it: `torch.cuda._sleep` on its stream, a host sleep in its host phase. Every invariant is
checked on the real run; `no-race` runs over the real footprints after the run, so that a race
that corrupted data is also seen as what it did (a wrong token, say): that is "manifested".
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from overlapcheck.backends.delays import Delay, delay_plan
from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend
from overlapcheck.backends.gpu.sleep import sleep_cycles_per_second
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.no_race import NoRace
from overlapcheck.invariants.races import RaceDetector
from overlapcheck.orchestrate.sim_replay import replay_on_sim


@dataclass
class Verdict:
    repeat: int
    reproduced: bool  # the counterexample's invariant was violated
    manifested: list[str]  # invariants other than no-race that failed (what the race did)
    race: str | None  # the race the footprints show, if any
    applied: int  # planned delays that found their operation
    missed: int

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
        }


def replay_once(
    cex: Counterexample,
    backend: TorchBackend,
    plan: list[Delay],
    deliveries: list[tuple[int, int, str]],
    repeat: int,
) -> tuple[Verdict, RunResult]:
    backend.delays = plan
    # Every violation (keep going): the verdict asks whether the recorded one manifested.
    checks = [i for i in cex.checks if i != NoRace.id]
    factory = None if cex.scheduler.is_reference else cex.scheduler.factory()
    result = run_scenario(
        cex.scenario, backend, checks, deliveries=deliveries, scheduler=factory, keep_going=True
    )
    if backend.device is not None:
        backend.device.finish()
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
    missed = len(injector.missed) if injector is not None else len(plan)
    return Verdict(repeat, reproduced, failed, race_line, applied, missed), result


MARGINS = (3.0, 2.0, 1.5, 1.0)


def with_margin(cex: Counterexample) -> tuple[Counterexample, float]:
    """The counterexample with its delays scaled up as far as the simulator still shows the same
    violation. Shrinking leaves each delay at the least that fails in the simulator, a knife edge
    that real timing noise falls off; a larger delay that still fails there is a sturdier replay."""
    for margin in MARGINS:
        timing = cex.data.get("timing", {})
        draws = {k: v * margin for k, v in timing.get("draws", {}).items()}
        scaled = Counterexample({**cex.data, "timing": {**timing, "draws": draws}}, cex.where)
        if margin == 1.0 or scaled.reproduced(replay_on_sim(scaled)) is not None:
            return scaled, margin
    return cex, 1.0


def replay_verdicts(
    cex: Counterexample, backend: TorchBackend, repeat: int
) -> tuple[list[Delay], list[Verdict]]:
    """The counterexample's delay plan (with margin), and one verdict per repeat on `backend`
    after a warm-up."""
    cex, _ = with_margin(cex)
    sim = replay_on_sim(cex)
    plan = delay_plan(sim.trace)
    try:
        # A warm-up run, not judged: a workload's first run compiles and caches (new batch
        # shapes), so its host phases run long and move the very ordering the plan sets up.
        replay_once(cex, backend, plan, sim.deliveries, -1)
        verdicts = [replay_once(cex, backend, plan, sim.deliveries, i)[0] for i in range(repeat)]
    finally:
        backend.delays = []  # later runs on this backend are not part of the replay
    return plan, verdicts


def replay_on_device(
    cex: Counterexample,
    backend_name: str = "cuda",
    repeat: int = 1,
    as_json: bool = False,
    preset: str | None = None,
    model: str | None = None,
) -> int:
    """Exit status: 1 if the counterexample reproduced in any repeat, 0 if never."""
    backend = make_torch_backend(backend_name, model=model, preset=preset)
    if backend_name == "cuda":
        backend.sleep_rate = sleep_cycles_per_second()
    plan, verdicts = replay_verdicts(cex, backend, repeat)
    out = sys.stderr if as_json else sys.stdout
    print(f"delay plan ({len(plan)} delays):", file=out)
    for delay in plan:
        print(f"  {delay.line()}", file=out)
    if backend_name != "cuda" and any(d.agent != "host" for d in plan):
        print(
            "  (on the CPU backend streams run synchronously: stream delays change nothing)",
            file=out,
        )
    hits = sum(v.reproduced for v in verdicts)
    if as_json:
        json.dump(
            {
                "invariant": cex.invariant,
                "backend": backend_name,
                "repeats": repeat,
                "reproduced": hits,
                "plan": [d.line() for d in plan],
                "verdicts": [v.to_json() for v in verdicts],
            },
            sys.stdout,
        )
        print()
    else:
        for v in verdicts:
            what = ", ".join(v.manifested) or "clean"
            print(
                f"repeat {v.repeat + 1:>2}: {'REPRODUCED' if v.reproduced else 'not reproduced'}"
                f"  invariants: {what}  race: {v.race or 'none'}"
                f"  delays applied {v.applied}/{v.applied + v.missed}"
            )
        print(f"{cex.invariant}: reproduced in {hits}/{repeat} repeats on {backend_name}")
    return 1 if hits else 0
