"""SGLang's own `Scheduler`, unmodified, as a scheduler under test (see docs/sglang.md): on the
simulated CUDA (`make_scheduler`), or on `device="cpu"` (`make_cpu_scheduler`).

    SGLANG_PATH=/path/to/folder-holding-sglang overlapcheck explore \\
        --scheduler overlapcheck.adapters.sglang:make_scheduler

The factories import the adapter on first use, after SGLang's dependencies are found: without the
`sglang` extra, importing this package works and a run says which are missing (one line).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlapcheck.adapters.sglang.upstream import load_sglang

if TYPE_CHECKING:
    from overlapcheck.adapters.sglang.adapter import SglangScheduler
    from overlapcheck.core.config import SchedulerConfig
    from overlapcheck.core.device import Device
    from overlapcheck.core.protocol import MessageSink, MessageSource


def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_scheduler` (see `adapter.make_scheduler`)."""
    load_sglang()
    from overlapcheck.adapters.sglang import adapter

    return adapter.make_scheduler(config, device, source, sink)


def make_cpu_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_cpu_scheduler` (see
    `adapter.make_cpu_scheduler`)."""
    load_sglang()
    from overlapcheck.adapters.sglang import adapter

    return adapter.make_cpu_scheduler(config, device, source, sink)


__all__ = ["make_cpu_scheduler", "make_scheduler"]
