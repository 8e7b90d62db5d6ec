"""SGLang's own `Scheduler`, unmodified, as a scheduler under test (see docs/sglang.md): on the
simulated CUDA (`make_scheduler`), or on `device="cpu"` (`make_cpu_scheduler`).

    SGLANG_PATH=/path/to/folder-holding-sglang overlapcheck explore \\
        --scheduler overlapcheck.adapters.sglang:make_scheduler
"""

from overlapcheck.adapters.sglang.adapter import make_cpu_scheduler, make_scheduler

__all__ = ["make_cpu_scheduler", "make_scheduler"]
