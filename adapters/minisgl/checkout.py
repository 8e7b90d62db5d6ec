"""Finding and importing mini-sglang: a checkout named by `MINISGL_PATH`, or an installed one.

mini-sglang imports a few packages at module level that only its real kernels and its server use
(ZeroMQ and msgpack for its transport, TVM-FFI for its C++ kernels). When one is absent, an
import-time stand-in takes its place in `sys.modules`: a module whose every name is a placeholder
that says, if ever called, that overlapcheck does not run it. Nothing of mini-sglang is edited.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

from overlapcheck.core.errors import UserError

ENV = "MINISGL_PATH"
SCHEDULER_FILE = Path("python", "minisgl", "scheduler", "scheduler.py")
# Imported at module level by code the scheduler imports, used only by what the adapter replaces.
STAND_INS = ("zmq", "zmq.asyncio", "msgpack", "tvm_ffi", "tvm_ffi.cpp")
# What the adapter uses of mini-sglang: (module, names). A checkout without one is incompatible.
NEEDED = (
    ("minisgl.scheduler", ("Scheduler", "SchedulerConfig")),
    ("minisgl.scheduler.prefill", ("ChunkedReq",)),
    ("minisgl.core", ("SamplingParams", "Req", "Context")),
    ("minisgl.message", ("UserMsg", "AbortBackendMsg", "DetokenizeMsg")),
    ("minisgl.engine", ("ForwardOutput", "Engine")),
    ("minisgl.engine.sample", ("Sampler",)),
    ("minisgl.distributed", ("DistributedInfo",)),
    ("minisgl.kvcache.radix_cache", ("RadixPrefixCache",)),
)


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


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} is an overlapcheck stand-in: mini-sglang's real "
            "transport and kernels are not run under the simulated CUDA"
        )

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StandIn(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


def _install_stand_ins() -> None:
    for name in STAND_INS:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is not None and not (parent and isinstance(sys.modules.get(parent), _StandIn)):
            continue
        module = _StandIn(name)
        module.__path__ = []  # a package, so that `import zmq.asyncio` finds its child
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], module)


def load() -> dict[str, Any]:
    """mini-sglang's modules the adapter uses, by module name. Raises UserError (one line) when
    there is no checkout or it lacks what the adapter needs."""
    root = os.environ.get(ENV)
    if root:
        path = Path(root).expanduser()
        if not (path / SCHEDULER_FILE).is_file():
            raise UserError(
                f"{ENV}={root} is not a mini-sglang checkout (no {SCHEDULER_FILE} there)"
            )
        python = str((path / "python").resolve())
        loaded = sys.modules.get("minisgl")
        where = getattr(loaded, "__file__", None)
        if loaded is not None and where and not str(Path(where).resolve()).startswith(python):
            raise UserError(
                f"{ENV}={root}, but another mini-sglang is already imported from {where}"
            )
        if python not in sys.path:
            sys.path.insert(0, python)
    elif importlib.util.find_spec("minisgl") is None:
        raise UserError(
            f"mini-sglang not found: set {ENV} to the root of a checkout, or install minisgl"
        )
    _install_stand_ins()
    modules: dict[str, Any] = {}
    for name, attrs in NEEDED:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # any import failure of theirs is an incompatible checkout
            raise UserError(
                f"mini-sglang checkout is not usable: importing {name} failed: "
                f"{type(err).__name__}: {err}"
            ) from None
        missing = [a for a in attrs if not hasattr(module, a)]
        if missing:
            raise UserError(
                f"mini-sglang checkout is incompatible: {name} has no {', '.join(missing)} "
                "(the adapter knows the API of 20fcd7f)"
            )
        modules[name] = module
    scheduler = modules["minisgl.scheduler"].Scheduler
    missing = [m for m in METHODS if not callable(getattr(scheduler, m, None))]
    if missing:
        raise UserError(
            f"mini-sglang checkout is incompatible: Scheduler has no {', '.join(missing)} "
            "(the adapter knows the API of 20fcd7f)"
        )
    _quiet()
    _deterministic(modules["minisgl.core"].Req)
    return modules


def _request_hash(req: Any) -> int:
    return hash(req.uid)


def _deterministic(req_class: Any) -> None:
    """mini-sglang keeps requests in sets (`DecodeManager.running_reqs`) and builds each decode
    batch by iterating one. `Req` hashes by identity, so that order follows memory addresses and
    differs from process to process. Hashing by uid keeps identity equality and makes the order
    the same in every process (a set never promised one)."""
    req_class.__hash__ = _request_hash


def _quiet() -> None:
    """mini-sglang logs at INFO (\"Scheduler is idle\" every idle iteration): warnings only."""
    import logging

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("minisgl") or name in ("core",):
            logging.getLogger(name).setLevel(logging.WARNING)
