"""`replay --backend cuda|cpu`: a counterexample replayed on the real engine, its plan and each
repeat's verdict printed (`replay/gpu.py` runs it)."""

from __future__ import annotations

import json
import sys

from overlapcheck.backends.gpu.backend import make_torch_backend
from overlapcheck.formats.counterexample import Counterexample
from overlapcheck.replay.gpu import replay_verdicts


def replay_on_device(
    cex: Counterexample,
    backend_name: str = "cuda",
    repeat: int = 1,
    as_json: bool = False,
    preset: str | None = None,
    model: str | None = None,
    under_test: Counterexample | None = None,
) -> int:
    """Exit status: 1 if the counterexample reproduced in any repeat, 0 if never. `under_test`
    (another scheduler on the same file) runs under the plan of `cex` as recorded."""
    backend = make_torch_backend(backend_name, model=model, preset=preset)
    plan, verdicts = replay_verdicts(cex, backend, repeat, under_test)
    out = sys.stderr if as_json else sys.stdout
    print(f"replay plan ({len(plan.gates)} gates, {len(plan.delays)} delays):", file=out)
    for line in plan.lines():
        print(f"  {line}", file=out)
    if backend_name != "cuda" and plan.sleeps and any(d.agent != "host" for d in plan.sleeps):
        print(
            "  (on the CPU backend streams run synchronously: stream delays change nothing)",
            file=out,
        )
    if backend_name != "cuda" and plan.gates:
        print(
            "  (on the CPU backend stream work runs when it is issued: a gate can only wait out "
            "its bound, and the racy order cannot happen there)",
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
                "plan": plan.lines(),
                "gates": [g.to_json() for g in plan.gates],
                "verdicts": [v.to_json() for v in verdicts],
            },
            sys.stdout,
        )
        print()
    else:
        for v in verdicts:
            what = ", ".join(v.manifested) or "clean"
            how = v.gate_line() or f"sleeps applied {v.applied}/{v.applied + v.missed}"
            drafts = f"  drafts: {v.drafts}" if v.drafts else ""
            print(
                f"repeat {v.repeat + 1:>2}: {'REPRODUCED' if v.reproduced else 'not reproduced'}"
                f"  invariants: {what}  race: {v.race or 'none'}  {how}{drafts}"
            )
        print(f"{cex.invariant}: reproduced in {hits}/{repeat} repeats on {backend_name}")
    return 1 if hits else 0
