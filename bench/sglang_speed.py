"""SGLang's own scheduler (`adapters/sglang`) beside the reference scheduler on the simulator, on
the simulated CUDA and on `device="cpu"`: iterations per wall second on one workload (a steady
decode batch of 8, as `minisgl_speed`). Each SGLang iteration is its whole event-loop iteration:
its scheduling, its `ScheduleBatch` and `ForwardBatch` preparation, its model runner with the toy
model, its sampler, its output processing and its own invariant checker; on the simulated CUDA
every aten op of it traced on its stream besides.
"""

from __future__ import annotations

from overlapcheck.bench import dispatch_floor
from overlapcheck.bench.adapter_speed import CHECK_SETS, REFERENCE, Row, measure, print_rows

SPEC = "overlapcheck.adapters.sglang:make_scheduler"


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no SGLang tree or package is found."""
    from overlapcheck.adapters.sglang import make_cpu_scheduler, make_scheduler

    measure("SGLang", make_scheduler, [], "warm-up", 1)  # imports torch and SGLang
    rows = []
    for checks, label in CHECK_SETS:
        rows.append(measure(REFERENCE, None, checks, label, repeats))
        rows.append(measure("SGLang (simulated CUDA)", make_scheduler, checks, label, repeats))
        rows.append(measure("SGLang (cpu)", make_cpu_scheduler, checks, label, repeats))
    print_rows("SGLang vs reference", rows, repeats)
    dispatch_floor.print_split("SGLang", dispatch_floor.measure(make_scheduler))
    return rows
