"""mini-sglang's own scheduler, unmodified, under the simulated CUDA.

    MINISGL_PATH=/path/to/mini-sglang overlapcheck explore \\
        --scheduler overlapcheck.adapters.minisgl:make_scheduler

See docs/minisgl.md.
"""

from overlapcheck.adapters.minisgl.adapter import make_scheduler

__all__ = ["make_scheduler"]
