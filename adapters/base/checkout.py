"""Finding and importing an upstream engine: a source tree named by an environment variable, or
the installed package; every failure one line (`UserError`, exit 2).

The tree is imported as it is: its folder goes on `sys.path`, nothing of it is edited or copied.
What the adapter uses of it is declared up front (`Upstream.needed`), so a checkout whose API the
adapter does not know is told as such, not met later as an `AttributeError` inside a run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from overlapcheck.adapters.base.stand_ins import install_stand_ins
from overlapcheck.core.errors import UserError


@dataclass(frozen=True, slots=True)
class Upstream:
    """One engine an adapter runs, and what the adapter needs of it.

    MINISGL = Upstream(name="mini-sglang", package="minisgl", env="MINISGL_PATH",
                       marker="python/minisgl/scheduler/scheduler.py",
                       import_root="python", known_api="20fcd7f")
    """

    name: str  # as messages name it
    package: str  # the top-level import name
    env: str  # the environment variable naming a source tree
    marker: str  # a file under the tree's root that proves it is one
    import_root: str = ""  # the folder under the root that goes on sys.path
    # (module, names) the adapter uses; a module given as a tuple is the first of those names
    # that the tree has (one renamed in its history), read back under the first name
    needed: tuple[tuple[str | tuple[str, ...], tuple[str, ...]], ...] = ()
    stand_ins: tuple[str, ...] = ()  # modules stood in for when not installed
    known_api: str = ""  # the version or commit whose API the adapter knows

    def incompatible(self, where: str, detail: str) -> UserError:
        known = f" (the adapter knows the API of {self.known_api})" if self.known_api else ""
        return UserError(f"{self.name} at {where} is incompatible: {detail}{known}")


@dataclass(frozen=True, slots=True)
class Loaded:
    """An imported engine: its modules by name, and where it came from."""

    upstream: Upstream
    modules: Mapping[str, ModuleType]
    root: Path  # the folder the package was imported from (a sys.path entry)
    tree: Path | None = None  # the source tree's root (`env`), None for an installed package

    def __getitem__(self, name: str) -> ModuleType:
        return self.modules[name]

    @property
    def package_dir(self) -> Path:
        return self.root / self.upstream.package

    def code_roots(self) -> tuple[Path, ...]:
        """The engine's source tree (its files then read as in its repository,
        `python/minisgl/scheduler/scheduler.py`, with its git commit), else the installed
        package's folder: every module of it a run imported is the code under test,
        fingerprinted file by file into a counterexample."""
        return (self.tree,) if self.tree is not None else (self.package_dir,)

    def incompatible(self, detail: str) -> UserError:
        return self.upstream.incompatible(str(self.root), detail)

    def require_methods(self, cls: type, methods: tuple[str, ...]) -> None:
        """UserError unless `cls` has every one of `methods` (the ones the adapter calls or
        overrides)."""
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        if missing:
            raise self.incompatible(f"{cls.__name__} has no {', '.join(missing)}")


def load(upstream: Upstream) -> Loaded:
    """Import the engine's modules the adapter needs. Raises UserError (one line) when there is
    no tree or package, another copy is already imported, or the tree lacks what is needed."""
    root = _put_on_path(upstream)
    install_stand_ins(upstream.stand_ins, upstream.name)
    where = str(root) if root is not None else upstream.package
    modules: dict[str, ModuleType] = {}
    for names, attrs in upstream.needed:
        name, module = _import_first(upstream, where, names)
        missing = [a for a in attrs if not hasattr(module, a)]
        if missing:
            raise upstream.incompatible(where, f"{name} has no {', '.join(missing)}")
        modules[names if isinstance(names, str) else names[0]] = module
    tree = None
    if root is None:
        root = _imported_from(upstream)
    else:
        tree = Path(os.environ[upstream.env]).expanduser().resolve()
    return Loaded(upstream, modules, root, tree)


def _import_first(
    upstream: Upstream, where: str, names: str | tuple[str, ...]
) -> tuple[str, ModuleType]:
    """The first of `names` the tree has, imported: (its name, the module). A module that is not
    there moves on to the next name; any other failure of its import is an unusable tree."""
    choices = (names,) if isinstance(names, str) else names
    for i, name in enumerate(choices):
        try:
            return name, importlib.import_module(name)
        except ModuleNotFoundError as err:
            if i + 1 < len(choices) and err.name is not None and name.startswith(err.name):
                continue  # (that module itself is absent: a renamed one, try the next name)
            failed: Exception = err
        except Exception as err:  # any import failure of theirs is an unusable tree
            failed = err
        raise UserError(
            f"{upstream.name} at {where} is not usable: importing {name} failed: "
            f"{type(failed).__name__}: {failed}"
        ) from None
    raise AssertionError("unreachable: `needed` names at least one module")


def _put_on_path(upstream: Upstream) -> Path | None:
    """The tree's import folder, put first on sys.path; None when the installed package is used."""
    given = os.environ.get(upstream.env)
    if not given:
        if importlib.util.find_spec(upstream.package) is None:
            raise UserError(
                f"{upstream.name} not found: set {upstream.env} to the root of a source tree, "
                f"or install {upstream.package}"
            )
        return None
    tree = Path(given).expanduser()
    if not (tree / upstream.marker).is_file():
        raise UserError(
            f"{upstream.env}={given} is not a {upstream.name} tree (no {upstream.marker} there)"
        )
    folder = (tree / upstream.import_root).resolve() if upstream.import_root else tree.resolve()
    imported = sys.modules.get(upstream.package)
    file = getattr(imported, "__file__", None)
    if imported is not None and file and not Path(file).resolve().is_relative_to(folder):
        raise UserError(
            f"{upstream.env}={given}, but another {upstream.name} is already imported from {file}"
        )
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return folder


def _imported_from(upstream: Upstream) -> Path:
    module = sys.modules.get(upstream.package) or importlib.import_module(upstream.package)
    file = getattr(module, "__file__", None)
    if file is None:  # a namespace package: its first folder
        return Path(next(iter(module.__path__))).resolve().parent
    return Path(file).resolve().parent.parent
