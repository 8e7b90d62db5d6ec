"""Import-time stand-ins for modules an engine imports at module level but uses only in what the
adapter replaces (its transport, its compiled kernels).

A stand-in is a module whose every name is a placeholder; calling one says that overlapcheck does
not run it. A module that is installed is never replaced. Nothing of the engine is edited.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class Placeholder:
    """Any name of a stand-in module: a class to derive from, an attribute chain, a callable that
    raises when called (the engine reached code the adapter says it never runs)."""

    def __init__(self, name: str, engine: str) -> None:
        self._name = name
        self._engine = engine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name} is an overlapcheck stand-in: {self._engine}'s real "
            "transport and kernels are not run under the simulated CUDA"
        )

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}", self._engine)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class StandIn(types.ModuleType):
    """A module of placeholders."""

    def __init__(self, name: str, engine: str) -> None:
        super().__init__(name)
        self._engine = engine

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.__name__}.{attr}", self._engine)


def install_stand_ins(names: tuple[str, ...], engine: str) -> None:
    """Put a stand-in into `sys.modules` for each of `names` that cannot be imported (a child of
    a stood-in parent is stood in too). Parents must come before their children."""
    for name in names:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is not None and not (parent and isinstance(sys.modules.get(parent), StandIn)):
            continue
        module = StandIn(name, engine)
        module.__path__ = []  # a package, so that `import zmq.asyncio` finds its child
        # A spec, as an imported module has: `importlib.util.find_spec` raises on a module in
        # `sys.modules` without one (a library probing for it later in the same process).
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], module)
