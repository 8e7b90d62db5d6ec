"""SGLang's own `Scheduler`, unmodified, as a scheduler under test (see docs/sglang.md).

    SGLANG_PATH=/path/to/folder-holding-sglang overlapcheck explore \\
        --scheduler overlapcheck.adapters.sglang:make_scheduler
"""

from overlapcheck.adapters.sglang.adapter import make_scheduler

__all__ = ["make_scheduler"]
