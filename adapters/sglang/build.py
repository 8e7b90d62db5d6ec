"""Building SGLang's own `Scheduler` for one run, as `run_scheduler_process` does in its process:
server arguments from the run's configuration, the process-wide configuration published, then
`Scheduler(server_args, port_args)`, which builds its model worker, memory pools (its own
`ReqToTokenPool`, token-to-KV allocator, paged when `page_size` > 1) and radix tree itself.

The model it loads is the toy model (`toy.py`), registered under an architecture of its own; its
checks of its own books (`SchedulerInvariantChecker`) are switched on strictly (a leak raises).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import random
import socket
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from overlapcheck.adapters.base import Loaded
from overlapcheck.adapters.sglang.model import TOY_SERVER_ARGS, model_dir
from overlapcheck.adapters.sglang.toy import ARCH, make_model_class
from overlapcheck.core.config import SchedulerConfig

# SGLang's names of our queue policies (`lpm-aging` is ours alone).
POLICIES = {"fcfs": "fcfs", "lpm": "lpm", "dfs-weight": "dfs-weight", "lof": "lof",
            "random": "random", "hrrn": "hrrn"}  # fmt: skip

# SGLang's own consistency checks, every iteration, raising on a violation.
STRICT_CHECKS = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}
# Objects the interpreter keeps frozen at start (3.12: a few hundred constants; 3.11: none).
_FROZEN_AT_START = gc.get_freeze_count()

# Pages on demand (admission on the prompt): the output estimate SGLang's admission counts for
# each request, `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`, clipped to nothing (see `admission`).
ON_DEMAND_CLIP = 0
# SGLang's value of it as its module read it at import (the environment's, else 4096), by file.
_SHIPPED_CLIP: dict[str, int] = {}

# Engines built in this process and not yet collected. An engine ends in reference cycles, with
# threads of its own (its process groups' gloo loops, its TCP store, ZeroMQ's: 13), which poll
# until a full collection frees it; runs move their objects to the oldest generation, where full
# collections are rare (a 300 s search ended with hundreds of engines' threads, at load 20-60).
# A full collection (0.4 s) runs once this many finished ones wait.
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()
WAITING_ENGINES = 16

# Offline: the model folder is local; nothing is fetched.
QUIET = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def server_args(loaded: Loaded, config: SchedulerConfig, device: str, simulated: bool) -> Any:
    # A switch the scheduler does not have is ignored (core/protocol.py): ours alone run as fcfs.
    policy = POLICIES.get(config.policy, "fcfs")
    # A request gets what `core.rules.max_output` allows (the front end clamps `max_new_tokens` to
    # it); two positions of slack keep SGLang's own clamp (context length - 1 - prompt) above it.
    return loaded["sglang.srt.server_args"].ServerArgs(
        model_path=str(
            model_dir(config.vocab_size, config.eos_token_id, config.max_seq_len + 2, simulated)
        ),
        device=device,
        dtype="float32",
        **TOY_SERVER_ARGS,
        max_running_requests=config.num_slots,
        max_total_tokens=config.num_pages * config.page_size,
        page_size=config.page_size,
        chunked_prefill_size=config.max_extend_tokens,
        context_length=config.max_seq_len + 2,
        disable_radix_cache=config.cache == "naive",
        disable_overlap_schedule=config.loop == "normal",
        schedule_policy=policy,
        # pages on demand (admission on the prompt, preemption when decoding runs out): where
        # SGLang's admission still counts the running requests' remaining output past the
        # clipped estimate (`admission`: an ignore_eos newcomer on the chunk cache), it counts
        # it at `new_token_ratio` (0.7 x this), lowered as its users who overcommit lower it
        schedule_conservativeness=0.1 if config.page_alloc == "on-demand" else 1.0,
        random_seed=config.seed,
        nccl_port=free_port(),
    )


# SGLang picks its process group's port with the global `random`, which every build seeds with
# the run's seed: two processes building at once (test workers, search workers) drew the same
# ports and one failed with EADDRINUSE. Ours comes from the OS's entropy instead; below the
# ephemeral range, as SGLang keeps it (its store binds the port after the pick).
_PORTS = random.Random()


def free_port(low: int = 22_000, high: int = 29_999, attempts: int = 64) -> int | None:
    """A free TCP port in [low, high] below the ephemeral range; None (SGLang picks) if none of
    `attempts` drawn is."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(high, int(f.read().split()[0]) - 1)
    except (OSError, ValueError, IndexError):
        high = min(high, 32_767)
    for port in _PORTS.sample(range(low, high + 1), min(attempts, max(high - low + 1, 0))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    return None


def build(
    loaded: Loaded, scheduler_class: type, config: SchedulerConfig, device: str, simulated: bool
) -> Any:
    """A new scheduler of `scheduler_class` (a subclass of SGLang's `Scheduler`) for one run
    (`simulated`: on the simulated CUDA, with the toy model's one-cell KV heads)."""
    for name, value in {**STRICT_CHECKS, **QUIET}.items():
        os.environ.setdefault(name, value)
    registry = loaded["sglang.srt.models.registry"].ModelRegistry
    output = loaded["sglang.srt.layers.logits_processor"].LogitsProcessorOutput
    if ARCH not in registry.models:
        registry.models[ARCH] = make_model_class(output)
    args = server_args(loaded, config, device, simulated)
    admission(loaded, config)
    if len(_ENGINES) > WAITING_ENGINES:
        gc.collect()
    # One engine at a time in a process, as SGLang rebuilds one: the last one's process groups
    # torn down with its own test teardown, the configuration published anew (last wins).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # its gc.collect() scans young objects only: the last engine's cycles wait for the next
        # full collection, as any long-lived garbage
        with _young_only_collections():
            loaded["sglang.srt.distributed.parallel_state"].cleanup_dist_env_and_memory()
    context = loaded["sglang.srt.runtime_context"]
    context.reset_context()
    # Its process-wide pool of forward input buffers, as a new process starts (the last run's
    # belong to that run's device).
    buffers = importlib.import_module("sglang.srt.model_executor.input_buffers")
    getattr(buffers, "_forward_input_buffer_pool", {}).clear()
    port_args = loaded["sglang.srt.server_args"].PortArgs.init_new(args)
    context.publish(
        args, role="scheduler", ranks=context.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0)
    )
    try:
        with _young_only_collections(), _no_watchdog(loaded):
            scheduler = scheduler_class(args, port_args)
    except TypeError as err:
        raise loaded.incompatible(f"Scheduler(server_args, port_args): {err}") from None
    _ENGINES.add(scheduler)
    return scheduler


def admission(loaded: Loaded, config: SchedulerConfig) -> None:
    """Pages on demand (`page_alloc`: admission on the prompt, preemption when decoding runs
    out) as SGLang's own knob for it. Its admission counts each request's output estimate,
    `min(max_new_tokens, CLIP_MAX_NEW_TOKENS)` (whole for a newcomer, at `new_token_ratio` for a
    running one); `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`, which it reads once at import into
    `schedule_policy.CLIP_MAX_NEW_TOKENS`, clips it. Clipped to nothing, it admits on the prompt
    and retracts when the running requests outgrow the pool (`retract_decode`), as the reference
    does with pages on demand; otherwise the value it read at import. Set per run, as a process
    started with the variable would hold it (a process runs one configuration; ours run many)."""
    module: Any = loaded["sglang.srt.managers.schedule_policy"]
    shipped = _SHIPPED_CLIP.setdefault(str(module.__file__), module.CLIP_MAX_NEW_TOKENS)
    module.CLIP_MAX_NEW_TOKENS = ON_DEMAND_CLIP if config.page_alloc == "on-demand" else shipped


class _NoWatchdog:
    """What `Scheduler` keeps of its watchdog (it calls nothing on it): none is started."""


@contextlib.contextmanager
def _no_watchdog(loaded: Loaded) -> Iterator[None]:
    """SGLang's scheduler watchdog is not started: a thread per `Scheduler` that signals the
    parent process (SIGQUIT) when a batch makes no progress for `watchdog_timeout` (300 s), as a
    server process that hangs is killed. overlapcheck's `no-hang` watches each step instead; and
    a process here builds a `Scheduler` per run: each one's watchdog thread, which never ends,
    kept it alive (its process groups, ZeroMQ context and their 14 threads) for the rest of the
    process, and would signal a search's or a test run's parent 300 s after a run left a batch
    in flight. Its other start-up work runs as it ships."""
    module: Any = loaded["sglang.srt.managers.scheduler"]
    shipped = getattr(module, "create_scheduler_watchdog", None)
    if shipped is None:
        yield
        return
    module.create_scheduler_watchdog = lambda *args, **kwargs: _NoWatchdog()
    try:
        yield
    finally:
        module.create_scheduler_watchdog = shipped


@contextlib.contextmanager
def _young_only_collections() -> Iterator[None]:
    """SGLang's `gc.collect()` before it sizes its KV pool scans what exists before the build
    too: torch's and SGLang's modules, about 0.4 s a run. Frozen for the build, they are not
    scanned; what the build leaves as garbage still is, and the rest is collected as usual
    afterwards (unfrozen into the oldest generation, where the modules' objects belong). When
    the caller has frozen objects of its own nothing is frozen or unfrozen (it would thaw
    theirs)."""
    if gc.get_freeze_count() > _FROZEN_AT_START:  # (see `harness.runner._fewer_collections`)
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
