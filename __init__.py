"""overlapcheck: a model checker for LLM-serving schedulers that use overlap scheduling.

The public API (imported lazily, so that `import overlapcheck` stays cheap)::

    from overlapcheck import run_scenario, SimBackend, Timing, Scenario, RequestSpec
    from overlapcheck import SchedulerConfig, Device, SchedulerUnderTest, Books, Holding
    from overlapcheck import search, SearchSpec, SchedulerSpec, named_scenario

See `core/protocol.py` for what a scheduler under test must do, and docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that owns it
_EXPORTS = {
    "SchedulerConfig": "overlapcheck.core.config",
    "Device": "overlapcheck.core.device",
    "Event": "overlapcheck.core.device",
    "ForwardOutput": "overlapcheck.core.device",
    "BatchInput": "overlapcheck.core.batch",
    "SeqWork": "overlapcheck.core.batch",
    "RowWrite": "overlapcheck.core.batch",
    "UserMsg": "overlapcheck.core.messages",
    "AbortMsg": "overlapcheck.core.messages",
    "TokenMsg": "overlapcheck.core.messages",
    "RejectMsg": "overlapcheck.core.messages",
    "SamplingParams": "overlapcheck.core.messages",
    "SchedulerUnderTest": "overlapcheck.core.protocol",
    "SchedulerFactory": "overlapcheck.core.protocol",
    "MessageSource": "overlapcheck.core.protocol",
    "MessageSink": "overlapcheck.core.protocol",
    "Books": "overlapcheck.core.protocol",
    "Holding": "overlapcheck.core.protocol",
    "HasBooks": "overlapcheck.core.protocol",
    "InvariantError": "overlapcheck.core.errors",
    "max_output": "overlapcheck.core.rules",
    "rejection": "overlapcheck.core.rules",
    "SimBackend": "overlapcheck.backends.sim.backend",
    "Timing": "overlapcheck.backends.sim.timing",
    "Profile": "overlapcheck.backends.sim.timing",
    "make_backend": "overlapcheck.backends.registry",
    "Scenario": "overlapcheck.core.scenario",
    "RequestSpec": "overlapcheck.core.scenario",
    "named_scenario": "overlapcheck.scenarios.named",
    "load_scenario_file": "overlapcheck.scenarios.loader",
    "run_scenario": "overlapcheck.harness.runner",
    "RunResult": "overlapcheck.harness.runner",
    "Violation": "overlapcheck.invariants.base",
    "Invariant": "overlapcheck.invariants.base",
    "SchedulerSpec": "overlapcheck.harness.scheduler_spec",
    "search": "overlapcheck.explore.search",
    "SearchSpec": "overlapcheck.explore.search",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'overlapcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
