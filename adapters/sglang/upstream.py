"""Finding and importing SGLang: a folder holding the `sglang` package named by `SGLANG_PATH` (an
unpacked wheel or sdist, or a git checkout, whose package sits under `python/`), or an installed
`sglang`. Loaded once per process; every failure one line (exit 2).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from overlapcheck.adapters.base import Loaded, Upstream, load
from overlapcheck.adapters.sglang.stand_ins import install as install_stand_ins
from overlapcheck.core.errors import UserError

ENV = "SGLANG_PATH"
MARKER = "sglang/srt/managers/scheduler.py"
KNOWN_API = "0.5.23"

# What the adapter uses of SGLang: (module, names). A tree without one is incompatible.
NEEDED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang.srt.server_args", ("ServerArgs", "PortArgs")),
    ("sglang.srt.runtime_context", ("publish", "reset_context")),
    (
        "sglang.srt.managers.schedule_policy",
        ("SchedulePolicy", "CacheAwarePolicy", "CacheAgnosticPolicy", "CLIP_MAX_NEW_TOKENS"),
    ),
    ("sglang.srt.managers.schedule_batch", ("Req",)),
    ("sglang.srt.sampling.sampling_params", ("SamplingParams",)),
    ("sglang.srt.mem_cache.radix_cache", ("RadixCache", "RadixKey")),
    ("sglang.srt.mem_cache.base_prefix_cache", ("InsertParams",)),
    ("sglang.srt.managers.scheduler", ("Scheduler",)),
    (
        "sglang.srt.managers.io_struct",
        ("TokenizedGenerateReqInput", "AbortReq", "BatchTokenIDOutput"),
    ),
    ("sglang.srt.models.registry", ("ModelRegistry",)),
    ("sglang.srt.distributed.parallel_state", ("cleanup_dist_env_and_memory",)),
    ("sglang.srt.layers.logits_processor", ("LogitsProcessorOutput",)),
    ("sglang.srt.mem_cache.unified_cache.components", ("ComponentType",)),
)

# Imported by the modules the adapter loads (the `sglang` extra of pyproject.toml installs them).
DEPENDENCIES = (
    "aiohttp", "tvm_ffi", "compressed_tensors", "dill", "einops", "fastapi", "gguf", "greenlet",
    "IPython", "msgspec", "openai", "orjson", "partial_json_parser", "PIL", "psutil", "pybase64",
    "pydantic", "zmq", "regex", "requests", "sentencepiece", "setproctitle", "starlette", "triton",
    "uvicorn", "transformers", "torch",
)  # fmt: skip


def missing_dependencies() -> list[str]:
    return [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]


def _upstream(import_root: str) -> Upstream:
    return Upstream(
        name="SGLang",
        package="sglang",
        env=ENV,
        marker=str(Path(import_root, MARKER)) if import_root else MARKER,
        import_root=import_root,
        needed=NEEDED,
        known_api=KNOWN_API,
    )


def load_sglang() -> Loaded:
    """SGLang's modules (imported once per process: its import takes seconds; the tree is
    checked at every call)."""
    missing = missing_dependencies()
    if missing:
        raise UserError(
            f"SGLang's dependencies are not installed ({', '.join(missing)}): "
            "pip install 'overlapcheck[sglang]'"
        )
    given = os.environ.get(ENV)
    checkout = bool(given) and (Path(given or ".").expanduser() / "python" / MARKER).is_file()
    install_stand_ins()
    import greenlet  # (one of its dependencies, checked above)

    # Imported on a stack of its own: a module of SGLang's keeps an exception from its import
    # (`torch_memory_saver_adapter.import_error`), whose frames' callers would otherwise be the
    # run that imported it, kept with its scheduler and their threads for the whole process.
    upstream = _upstream("python" if checkout else "")
    loaded: Loaded = greenlet.greenlet(lambda: load(upstream)).switch()
    _quiet()
    return loaded


def _quiet() -> None:
    """SGLang logs from many modules (its warnings about a tiny KV pool among them): errors
    only. Its own checks raise."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("sglang"):
            logger = logging.getLogger(name)
            # each setLevel clears every logger's cache: only the ones not quiet yet (0.5 s a
            # run for the 1,400 of them otherwise)
            if logger.level != logging.ERROR:
                logger.setLevel(logging.ERROR)


def module(loaded: Loaded, name: str, attribute: str) -> Any:
    """SGLang's module `name`, which must have `attribute` (else the API is not the one known)."""
    try:
        found = importlib.import_module(name)
    except ImportError as err:
        raise loaded.incompatible(f"importing {name} failed: {err}") from None
    if not hasattr(found, attribute):
        raise loaded.incompatible(f"{name} has no {attribute}")
    return found
