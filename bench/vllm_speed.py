"""vLLM's own scheduler under the simulated CUDA beside the reference scheduler on the simulator:
iterations per wall second on one workload (a steady decode batch of 8), for the async scheduler
with and without ngram drafts and for the synchronous one.

The difference is vLLM's own scheduling (its `schedule()` and `update_from_output()` are a few
milliseconds of Python a step) and the stand-in worker's torch code, every aten op of which goes
through the simulated CUDA's dispatch mode and is traced with its cells.
"""

from __future__ import annotations

from overlapcheck.bench import dispatch_floor
from overlapcheck.bench.adapter_speed import CHECK_SETS, REFERENCE, Row, measure, print_rows


def main(repeats: int = 3) -> list[Row]:
    """Raises UserError (one line) when no vLLM tree or package is found."""
    from overlapcheck.adapters.vllm import (
        make_ngram_scheduler,
        make_scheduler,
        make_sync_scheduler,
    )

    measure("vLLM", make_scheduler, [], "warm-up", 1)  # imports vLLM, builds its configs
    rows = []
    for checks, label in CHECK_SETS:
        rows.append(measure(REFERENCE, None, checks, label, repeats))
        rows.append(measure("vLLM AsyncScheduler", make_scheduler, checks, label, repeats))
        rows.append(
            measure("vLLM AsyncScheduler, k=3", make_ngram_scheduler, checks, label, repeats)
        )
        rows.append(
            measure("vLLM Scheduler (sync)", make_sync_scheduler, checks, label, repeats, "normal")
        )
    print_rows("vLLM vs reference", rows, repeats)
    dispatch_floor.print_split("vLLM AsyncScheduler", dispatch_floor.measure(make_scheduler))
    return rows
