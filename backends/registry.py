"""Backends by name. The real engine is imported lazily: the simulator path needs no torch."""

from __future__ import annotations

from typing import Any

from overlapcheck.backends.base import Backend
from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.core.errors import UserError

BACKENDS = ("sim", "cpu", "cuda")


def make_backend(name: str, timing: Timing | None = None, **options: Any) -> Backend:
    if name == "sim":
        return SimBackend(timing)
    if name in ("cpu", "cuda"):
        try:
            from overlapcheck.backends.gpu.backend import make_torch_backend
        except ImportError as err:
            raise UserError(
                f"backend {name} needs torch and transformers ({err.name or err} is missing): "
                "pip install 'overlapcheck[real]'"
            ) from None
        return make_torch_backend(name, **options)
    raise UserError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
