"""Finding and importing mini-sglang: a checkout named by `MINISGL_PATH`, or an installed one.

mini-sglang imports a few packages at module level that only its real kernels and its server use
(ZeroMQ and msgpack for its transport, TVM-FFI for its C++ kernels). When one is absent, an
import-time stand-in takes its place (`adapters/base/stand_ins.py`). Nothing of mini-sglang is
edited.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from contextvars import ContextVar
from typing import Any, NamedTuple

from overlapcheck.adapters.base import Loaded, Upstream
from overlapcheck.adapters.base import load as load_upstream

MINISGL = Upstream(
    name="mini-sglang",
    package="minisgl",
    env="MINISGL_PATH",
    marker="python/minisgl/scheduler/scheduler.py",
    import_root="python",
    # What the adapter uses of mini-sglang: (module, names).
    needed=(
        ("minisgl.scheduler", ("Scheduler", "SchedulerConfig")),
        ("minisgl.scheduler.prefill", ("ChunkedReq",)),
        ("minisgl.core", ("SamplingParams", "Req", "Context", "Batch")),
        # (AbortBackendMsg: request cancellation, since 578df98; without it the front end
        # cancels, `adapter.py`)
        ("minisgl.message", ("UserMsg", "DetokenizeMsg")),
        ("minisgl.engine", ("ForwardOutput", "Engine")),
        ("minisgl.engine.sample", ("Sampler",)),
        # (GraphCaptureBuffer since 1961602: before, the attention backend's capture held the
        # batch's inputs, `engine.py`)
        ("minisgl.engine.graph", ("GraphRunner",)),
        ("minisgl.distributed", ("DistributedInfo",)),
        # the radix cache's module: `radix_manager` before c7f800d (its clock is read from `time`)
        (("minisgl.kvcache.radix_cache", "minisgl.kvcache.radix_manager"), ("time",)),
    ),
    # Imported at module level by code the scheduler imports, used only by what the adapter
    # replaces.
    stand_ins=("zmq", "zmq.asyncio", "msgpack", "tvm_ffi", "tvm_ffi.cpp"),
    known_api="20fcd7f",
)
ENV = MINISGL.env

# The Scheduler methods the adapter calls or overrides (it steps one loop iteration at a time).
METHODS = (
    "overlap_loop",
    "normal_loop",
    "run_when_idle",
    "offline_receive_msg",
    "offline_send_result",
    "_schedule_next_batch",
    "_forward",
    "_process_last_data",
)


class Features(NamedTuple):
    """What a mini-sglang checkout can do that it could not always (found in its code, so any
    commit of its history is judged by what it has)."""

    paged: bool  # pages of more than one token (5e52ef3: `CacheManager` takes a page size)
    cancels: bool  # request cancellation (578df98: `AbortBackendMsg`)
    # CUDA graphs the adapter can capture: `GraphRunner._capture_graphs` to stand in for (before
    # f074873 the capture ran inline in its `__init__`)
    graphs: bool
    # the graph runner's `GraphCaptureBuffer` holds a captured batch's inputs (since 1961602;
    # before, the attention backend's capture did)
    capture_buffer: bool
    # A finished request keeps its row and pages until no batch in flight holds it (before
    # 1961602: `_process_last_data(last_data, ongoing_data)`, `finished_reqs` are those not yet
    # given back); since, it gives them back when it finishes (`finished_reqs`: given back).
    defers_frees: bool


def features(loaded: Loaded) -> Features:
    cache = importlib.import_module("minisgl.scheduler.cache").CacheManager
    process = loaded["minisgl.scheduler"].Scheduler._process_last_data
    return Features(
        paged="page_size" in inspect.signature(cache).parameters,
        cancels=hasattr(loaded["minisgl.message"], "AbortBackendMsg"),
        graphs=hasattr(loaded["minisgl.engine.graph"].GraphRunner, "_capture_graphs"),
        capture_buffer=hasattr(loaded["minisgl.engine.graph"], "GraphCaptureBuffer"),
        defers_frees="ongoing_data" in inspect.signature(process).parameters,
    )


@functools.cache
def current_features() -> Features:
    """This process's checkout's `Features` (one checkout per process: `load`)."""
    return features(load())


def load() -> Loaded:
    """mini-sglang's modules the adapter uses, by module name. Raises UserError (one line) when
    there is no checkout or it lacks what the adapter needs."""
    loaded = load_upstream(MINISGL)
    loaded.require_methods(loaded["minisgl.scheduler"].Scheduler, METHODS)
    _quiet()
    _deterministic(loaded["minisgl.core"].Req)
    return loaded


# The rank whose Scheduler is being built or stepped (the adapter sets it: `RANK.set`).
RANK: ContextVar[int] = ContextVar("overlapcheck_minisgl_rank", default=0)


def _request_hash(req: Any) -> int:
    rank = req.__dict__.get("_overlapcheck_rank")
    if rank is None:  # first hashed by the rank that made it
        rank = req.__dict__["_overlapcheck_rank"] = RANK.get()
    return hash(req.uid) if rank == 0 else hash((req.uid, rank))


def _deterministic(req_class: Any) -> None:
    """mini-sglang keeps requests in sets (`DecodeManager.running_reqs`) and builds each decode
    batch by iterating one. `Req` hashes by identity, so that order follows memory addresses and
    differs from process to process. Hashing by uid keeps identity equality and makes the order
    the same in every process (a set never promised one).

    Under tensor parallelism each rank is a process of its own, whose addresses order its sets
    its own way: ranks 1.. hash by (uid, rank), so each orders a set of requests differently
    from rank 0, and the same way in every run (rank 0, and a run of one rank, as before)."""
    req_class.__hash__ = _request_hash


def _quiet() -> None:
    """mini-sglang logs at INFO (\"Scheduler is idle\" every idle iteration): warnings only."""
    import logging

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("minisgl") or name in ("core",):
            logging.getLogger(name).setLevel(logging.WARNING)
