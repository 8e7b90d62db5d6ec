"""SGLang's own scheduler (`adapters/sglang`, on `device="cpu"`) beside the reference scheduler on
the simulator: iterations per wall second on one workload (a steady decode batch of 8, as
`minisgl_speed`). Each SGLang iteration is its whole event-loop iteration: its scheduling, its
`ScheduleBatch` and `ForwardBatch` preparation, its model runner with the toy model, its sampler,
its output processing and its own invariant checker.
"""

from __future__ import annotations

from overlapcheck.bench.minisgl_speed import Row, _measure

SPEC = "overlapcheck.adapters.sglang:make_scheduler"


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no SGLang tree or package is found."""
    from overlapcheck.adapters.sglang import make_scheduler

    _measure("SGLang", make_scheduler, [], "warm-up", 1)  # imports torch and SGLang
    rows = []
    for checks, label in (([], "footprints only"), (None, "all invariants")):
        rows.append(_measure("reference (sim)", None, checks, label, repeats))
        rows.append(_measure("SGLang (cpu)", make_scheduler, checks, label, repeats))
    print(f"SGLang vs reference: decode batch 8, 48 tokens per request (best of {repeats})")
    print(f"{'scheduler':<30}{'checks':<18}{'iterations':>11}{'best s':>9}{'iter/s':>10}")
    for r in rows:
        print(
            f"{r.scheduler:<30}{r.checks:<18}{r.iterations:>11}{r.best_seconds:>9.3f}"
            f"{r.iterations_per_second:>10.1f}"
        )
    return rows
