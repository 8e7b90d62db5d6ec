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
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.protocol import serves_pools_from

if TYPE_CHECKING:
    from overlapcheck.adapters.sglang.adapter import SglangScheduler
    from overlapcheck.core.device import Device
    from overlapcheck.core.protocol import MessageSink, MessageSource


def serving_floor(config: SchedulerConfig) -> int:
    """The smallest pool (tokens) SGLang answers every request on: its longest prompt is the pool
    less 6 tokens (`max_req_input_len`: `max_req_len` - 5, `max_req_len` the pool less one), and a
    prompt over it is answered after a one-token prefill, which its admission takes only with a
    page and a token free beyond that token's page (finding 3 of docs/sglang.md: below this a
    request SGLang refuses waits forever)."""
    return max(7, 2 * config.page_size + 2)


@serves_pools_from(serving_floor)
def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_scheduler` (see `adapter.make_scheduler`)."""
    load_sglang()
    from overlapcheck.adapters.sglang import adapter

    return adapter.make_scheduler(config, device, source, sink)


@serves_pools_from(serving_floor)
def make_cpu_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SglangScheduler:
    """`--scheduler overlapcheck.adapters.sglang:make_cpu_scheduler` (see
    `adapter.make_cpu_scheduler`)."""
    load_sglang()
    from overlapcheck.adapters.sglang import adapter

    return adapter.make_cpu_scheduler(config, device, source, sink)


__all__ = ["make_cpu_scheduler", "make_scheduler"]
