"""Finding and importing vLLM: a source tree named by `VLLM_PATH`, or an installed `vllm`.

What the adapter uses of it is declared here; a tree without one of these names is incompatible
(one line, exit 2). vLLM inspects a model's architecture once in a subprocess (and caches the
result in the user's cache folder): that subprocess imports vLLM too, so the tree's root also goes
on `PYTHONPATH` for this process's children. Nothing of vLLM is edited.
"""

from __future__ import annotations

import logging
import os
from functools import cache

from overlapcheck.adapters.base import Loaded, Upstream, load

ASYNC_SCHEDULER = "vllm.v1.core.sched.async_scheduler"
SCHEDULER = "vllm.v1.core.sched.scheduler"

VLLM = Upstream(
    name="vLLM",
    package="vllm",
    env="VLLM_PATH",
    marker="vllm/v1/core/sched/scheduler.py",
    needed=(
        ("vllm.config", ("CacheConfig", "DeviceConfig", "ModelConfig", "SchedulerConfig")),
        ("vllm.config", ("SpeculativeConfig", "KVTransferConfig", "VllmConfig", "ParallelConfig")),
        ("vllm.sampling_params", ("SamplingParams",)),
        ("vllm.v1.request", ("Request", "RequestStatus")),
        (SCHEDULER, ("Scheduler",)),
        (ASYNC_SCHEDULER, ("AsyncScheduler",)),
        ("vllm.v1.kv_cache_interface", ("FullAttentionSpec", "KVCacheConfig")),
        ("vllm.v1.kv_cache_interface", ("KVCacheGroupSpec",)),
        ("vllm.v1.core.single_type_kv_cache_manager", ("register_all_kvcache_specs",)),
        ("vllm.v1.core.kv_cache_utils", ("get_request_block_hasher", "init_none_hash")),
        ("vllm.utils.hashing", ("sha256",)),
        ("vllm.v1.structured_output", ("StructuredOutputManager",)),
        ("vllm.v1.outputs", ("ModelRunnerOutput", "DraftTokenIds", "KVConnectorOutput")),
        ("vllm.distributed.kv_transfer.kv_connector.v1.base", ("KVConnectorBase_V1",)),
        ("vllm.distributed.kv_transfer.kv_connector.v1.base", ("KVConnectorMetadata",)),
    ),
    known_api="0.34.0",
)

# The Scheduler methods the adapter calls (EngineCore's loop, stood in for).
METHODS = (
    "schedule",
    "update_from_output",
    "update_draft_token_ids",
    "add_request",
    "finish_requests",
    "has_requests",
    "get_grammar_bitmask",
)


@cache
def load_vllm() -> Loaded:
    """vLLM's modules, imported once per process. Raises UserError (one line)."""
    # No hub: the model is a local config.json. vLLM's INFO lines would drown the CLI's own.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    loaded = load(VLLM)
    loaded.require_methods(loaded[SCHEDULER].Scheduler, METHODS)
    loaded.require_methods(loaded[ASYNC_SCHEDULER].AsyncScheduler, METHODS)
    root = str(loaded.root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return loaded
