"""Stand-ins for what SGLang imports at module level but never runs on the paths the adapter takes.

`torchvision`: SGLang's multimodal helpers import it at module level (`torchvision.transforms`,
`InterpolationMode.BICUBIC` in class bodies), and the package index has no CPU-only build of it
(its wheels pull a CUDA torch). A meta-path finder answers every `torchvision.*` import with a
module of placeholders, as SGLang's own `_platform_stubs.py` does for Triton on macOS: a name
that starts with a capital is a class (a base to derive from, with any attribute), any other is a
module or a function that raises if called. `transformers` is asked first whether torchvision is
installed, so that it keeps saying no (it would otherwise build image processors on the stand-in).
A real torchvision, when installed, is used as it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

ENGINE = "SGLang"


class _Class(type):
    """A placeholder class: every attribute is another placeholder class."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Class(attr, (), {"__module__": cls.__module__})


class _Module(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr[:1].isupper():
            return _Class(attr, (), {"__module__": self.__name__})
        full = f"{self.__name__}.{attr}"
        module = sys.modules.get(full)
        if module is None:
            module = importlib.import_module(full)
        return module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.__name__} is an overlapcheck stand-in: {ENGINE}'s image processing is not "
            "run by the adapter"
        )


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of the stood-in packages and their children."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_ROOTS = ("torchvision",)


def install() -> None:
    """Once per process: stand in for each of `_ROOTS` that is not installed."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    missing = tuple(
        r for r in _ROOTS if r not in sys.modules and importlib.util.find_spec(r) is None
    )
    if not missing:
        return
    try:  # transformers caches its answer: ask while the truth (not installed) is still visible
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
        import_utils.is_torchvision_v2_available()
    except ImportError:
        pass
    sys.meta_path.insert(0, _Finder(missing))
