"""mini-sglang's own scheduler under the simulated CUDA beside the reference scheduler on the
simulator: iterations per wall second on one workload (a steady decode batch of 8).

The difference is the cost of running real torch code: every aten op of mini-sglang's scheduler
goes through the dispatch mode, is traced with its cells, and runs twice (at issue on the logical
copies, in simulated time on the physical ones), where the reference talks to the device seam in
a dozen calls per iteration.
"""

from __future__ import annotations

from overlapcheck.bench import dispatch_floor
from overlapcheck.bench.adapter_speed import CHECK_SETS, REFERENCE, Row, measure, print_rows

SPEC = "overlapcheck.adapters.minisgl:make_scheduler"


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no mini-sglang checkout is found."""
    from overlapcheck.adapters.minisgl import make_scheduler

    measure("mini-sglang", make_scheduler, [], "warm-up", 1)  # imports torch and mini-sglang
    rows = []
    for checks, label in CHECK_SETS:
        rows.append(measure(REFERENCE, None, checks, label, repeats))
        rows.append(measure("mini-sglang (simulated CUDA)", make_scheduler, checks, label, repeats))
    print_rows("mini-sglang vs reference", rows, repeats)
    dispatch_floor.print_split("mini-sglang", dispatch_floor.measure(make_scheduler, repeats))
    return rows
