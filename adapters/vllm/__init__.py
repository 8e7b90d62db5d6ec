"""vLLM's own v1 scheduler, unmodified, under the simulated CUDA.

    VLLM_PATH=/path/to/vllm overlapcheck explore \\
        --scheduler overlapcheck.adapters.vllm:make_scheduler

| factory | vLLM set-up |
| --- | --- |
| `make_scheduler` | `AsyncScheduler`, drafts as the config draws them (`draft_tokens`) |
| `make_sync_scheduler` | `Scheduler` (synchronous: `--loop normal`) |
| `make_ngram_scheduler` | `AsyncScheduler` with ngram drafts, k=3 |
| `make_sync_ngram_scheduler` | `Scheduler` with ngram drafts, k=3 (`--loop normal`) |
| `make_connector_scheduler` | `AsyncScheduler` with a consumer KV connector (deferred frees) |
| `make_unchunked_scheduler` | `AsyncScheduler` without chunked prefill |
| `make_pipeline_scheduler` | `AsyncScheduler` with two pipeline stages: three steps in flight |

The prefix cache follows the config's `cache` (`radix`: on). See docs/vllm.md.
"""

from __future__ import annotations

from overlapcheck.adapters.vllm.configs import Variant
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import UserError
from overlapcheck.core.protocol import MessageSink, MessageSource, SchedulerUnderTest


def _make(
    variant: Variant,
    config: SchedulerConfig,
    device: Device,
    source: MessageSource,
    sink: MessageSink,
) -> SchedulerUnderTest:
    if not isinstance(device, SimDevice):
        raise UserError("the vLLM adapter runs on the simulator only (--backend sim)")
    if not variant.asynchronous and config.loop != "normal":
        raise UserError(
            "vLLM's synchronous Scheduler waits for every step's output: run it with --loop normal"
        )
    from overlapcheck.adapters.vllm.adapter import VllmScheduler
    from overlapcheck.adapters.vllm.upstream import load_vllm

    return VllmScheduler(config, device, source, sink, load_vllm(), variant)


def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """`AsyncScheduler`, drafts as the config says."""
    return _make(Variant(), config, device, source, sink)


def make_sync_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """The synchronous `Scheduler` (`--loop normal`)."""
    return _make(Variant(asynchronous=False), config, device, source, sink)


def make_ngram_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """`AsyncScheduler` with ngram drafts, k=3."""
    return _make(Variant(drafts=3), config, device, source, sink)


def make_sync_ngram_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """The synchronous `Scheduler` with ngram drafts, k=3 (`--loop normal`)."""
    return _make(Variant(asynchronous=False, drafts=3), config, device, source, sink)


def make_connector_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """`AsyncScheduler` with a consumer KV connector (external KV loaded on a transfer stream),
    no drafts: the search is about the deferred block frees."""
    return _make(Variant(connector=True, drafts=0), config, device, source, sink)


def make_pipeline_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """`AsyncScheduler` as pipeline parallelism of two stages runs it: a batch queue of three
    (a step scheduled while two are in flight) and a request's decodes two steps apart; drafts as
    the config says. The stages themselves are the stand-in worker's one forward."""
    return _make(Variant(pipeline=2), config, device, source, sink)


def make_unchunked_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> SchedulerUnderTest:
    """`AsyncScheduler` without chunked prefill (a prompt is prefilled in one step)."""
    return _make(Variant(chunked_prefill=False), config, device, source, sink)


__all__ = [
    "make_connector_scheduler",
    "make_ngram_scheduler",
    "make_pipeline_scheduler",
    "make_scheduler",
    "make_sync_ngram_scheduler",
    "make_sync_scheduler",
    "make_unchunked_scheduler",
]
