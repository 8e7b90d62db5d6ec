"""The scheduler under test, one type from the command line to the harness: `SchedulerSpec`.

It says what the scheduler is (`reference`, `PATH.py:FACTORY` or `module:FACTORY`, or a factory
handed over in Python), how to build it (`factory`, `build`), whose fault a failure to build it
is (`ours`: the reference's is overlapcheck's, exit 3; a user's factory's is the user's, exit 2)
and which code it is (`source_hash`). Named by text, it travels to worker processes and into
counterexample files; loading it imports the code, once per process. The default, `reference`,
is the built-in reference scheduler.

    spec = SchedulerSpec.load("mine.py:make")     # parsed and imported: a bad one is UserError
    run_scenario(scenario, SimBackend(), scheduler=spec)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from overlapcheck.core.capability import provides
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import UserError
from overlapcheck.core.protocol import (
    MessageSink,
    MessageSource,
    SchedulerFactory,
    SchedulerUnderTest,
    pool_floor,
)
from overlapcheck.core.scenario import Scenario
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.fingerprint import CodeFingerprint, fingerprint
from overlapcheck.scenarios.strategies import floored

REFERENCE = "reference"


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """The scheduler under test: `reference`, `path/to/file.py:factory`,
    `package.module:factory`, or (`of`) a factory object handed over in Python."""

    text: str = REFERENCE
    # A factory given as an object rather than by name (`of`): used as is, never imported. Such
    # a spec works in this process only (a lambda does not travel to a worker).
    given: SchedulerFactory | None = field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, text: str) -> SchedulerSpec:
        """A spec from the command line, parsed and imported: the one place a bad `--scheduler`
        becomes one line (UserError), before any run."""
        spec = parse_spec(text)
        spec.factory()
        return spec

    @classmethod
    def of(cls, scheduler: SchedulerSpec | SchedulerFactory | None) -> SchedulerSpec:
        """What a caller handed `run_scenario`: a spec, a factory object, or None (the
        reference). The reference's own class is the reference (its failures are ours)."""
        if scheduler is None:
            return cls()
        if isinstance(scheduler, SchedulerSpec):
            return scheduler
        if scheduler is _load(REFERENCE):
            return cls()
        name = getattr(scheduler, "__qualname__", type(scheduler).__qualname__)
        return cls(f"{getattr(scheduler, '__module__', '?')}:{name}", scheduler)

    @property
    def is_reference(self) -> bool:
        return self.text == REFERENCE and self.given is None

    @property
    def ours(self) -> bool:
        """Whether a failure to build it is overlapcheck's (exit 3) rather than the user's:
        the built-in reference scheduler is overlapcheck's own code."""
        return self.is_reference

    def factory(self) -> SchedulerFactory:
        """The factory, imported once per process. Raises UserError with one line."""
        if self.given is not None:
            return self.given
        return _load(self.text)

    @property
    def fits(self) -> bool:
        """Whether the factory says what it serves (`fit` may change a scenario)."""
        factory = self.factory()
        return pool_floor(factory) is not None or hasattr(factory, "fit_scenario")

    def fit(self, scenario: Scenario) -> Scenario:
        """The workload nearest to `scenario` that the scheduler serves, by what its factory
        declares (`core/protocol.py`): a pool at least its floor (`serves_pools_from`), then
        its `fit_scenario`; `scenario` itself where nothing changes (or nothing is declared).
        A search draws and shrinks only such workloads."""
        factory = self.factory()
        fitted = scenario
        floor = pool_floor(factory)
        if floor is not None:
            fitted = floored(fitted, floor)
        fit = getattr(factory, "fit_scenario", None)
        if fit is not None:
            fitted = fit(fitted)
        return scenario if fitted == scenario else fitted

    def serves(self, scenario: Scenario) -> bool:
        """Whether `scenario` is one the scheduler serves as it is (`fit` leaves it)."""
        return self.fit(scenario) is scenario

    def build(
        self,
        config: SchedulerConfig,
        device: Device,
        source: MessageSource,
        sink: MessageSink,
        scenario: Scenario,
    ) -> SchedulerUnderTest:
        """The scheduler, built for one run. A user's factory that raises, or builds something
        without `step()`, is one line (UserError, exit 2); the reference failing to start is a
        bug of overlapcheck's (`CheckerBug`, exit 3), never blamed on a factory the user did
        not write."""
        factory = self.factory()
        try:
            sched: Any = factory(config, device, source, sink)
        except UserError:
            raise
        except Exception as err:
            if self.ours:
                raise CheckerBug(err, scenario) from err
            raise UserError(f"the scheduler factory failed: {type(err).__name__}: {err}") from None
        # (not isinstance, which would slow the scheduler's every step: core/capability.py)
        if not provides(sched, SchedulerUnderTest):
            if self.ours:
                raise CheckerBug(TypeError(f"{type(sched).__name__} has no step()"), scenario)
            raise UserError(
                f"the scheduler factory returned {type(sched).__name__}, which has no step() "
                "(see core/protocol.py)"
            )
        return sched  # type: ignore[no-any-return]

    def source_path(self) -> Path | None:
        """The file that defines the factory (None for the reference or a builtin module)."""
        if self.is_reference or self.given is not None:
            return None
        module = _module(self.text)
        file = getattr(module, "__file__", None)
        return Path(file) if file else None

    def source_hash(self) -> str | None:
        """The hash counterexample files recorded before they held the whole code
        (`fingerprint`): the defining file's bytes, or for the reference every module of its
        package. A replay of such a file compares it."""
        if self.is_reference:
            from overlapcheck import reference

            root = Path(reference.__file__).parent
            digest = hashlib.blake2b(digest_size=8)
            for module in sorted(root.rglob("*.py")):
                digest.update(module.relative_to(root).as_posix().encode() + b"\0")
                digest.update(module.read_bytes())
            return digest.hexdigest()
        path = self.source_path()
        if path is None or not path.is_file():
            return None
        return hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()

    def fingerprint(self, scheduler: object | None) -> CodeFingerprint:
        """Every file of the scheduler's code as this process holds it, after `scheduler` (the
        built object, None: not built here) was built: `harness/fingerprint.py`."""
        own: list[Path] = []
        roots: list[Path] = []
        path = self.source_path()
        if path is not None:
            own.append(path)
            if _is_path(self.text):
                roots.append(path.parent)
        elif self.given is not None:
            file = getattr(sys.modules.get(getattr(self.given, "__module__", "")), "__file__", None)
            own += [Path(file)] if isinstance(file, str) else []
        return fingerprint(scheduler, own, roots, [reference_folder()] if self.is_reference else [])

    def to_json(self, scheduler: object | None = None) -> dict[str, Any]:
        """What a counterexample records: the spec, and (after a run built `scheduler`) its
        code, file by file, and one hash of it."""
        code = self.fingerprint(scheduler)
        return {"spec": self.text, "source_hash": code.digest(), "code": code.to_json()}


def reference_folder() -> Path:
    from overlapcheck import reference

    return Path(reference.__file__).parent


def _is_path(text: str) -> bool:
    """Whether a spec names a file (`PATH.py:FACTORY`) rather than a module."""
    where = text.rpartition(":")[0]
    return where.endswith(".py") or "/" in where or "\\" in where


def parse_spec(text: str) -> SchedulerSpec:
    """A spec from the command line, checked for shape (not loaded). Raises UserError."""
    text = text.strip()
    if text == REFERENCE:
        return SchedulerSpec()
    where, sep, name = text.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserError(
            f"--scheduler {text!r}: expected PATH.py:FACTORY, module:FACTORY or {REFERENCE}"
        )
    return SchedulerSpec(text)


@cache
def _module(text: str) -> ModuleType:
    where = text.rpartition(":")[0]
    if _is_path(text):
        path = Path(where)
        if not path.is_file():
            raise UserError(f"--scheduler {text}: no such file {where}")
        name = (
            "overlapcheck_plugin_"
            + hashlib.blake2b(str(path.resolve()).encode(), digest_size=6).hexdigest()
        )
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UserError(f"--scheduler {text}: cannot load {where} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        # Its folder goes on the import path, as Python puts a script's: a scheduler split
        # over files imports its other modules as it would when run as a script.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise UserError(
                f"--scheduler {text}: importing {where} failed: {type(err).__name__}: {err}"
            ) from None
        return module
    try:
        return _import_here_too(where)
    except ImportError as err:
        raise UserError(f"--scheduler {text}: cannot import {where}: {err}") from None
    except Exception as err:
        raise UserError(
            f"--scheduler {text}: importing {where} failed: {type(err).__name__}: {err}"
        ) from None


def _import_here_too(name: str) -> ModuleType:
    """Import `name`, looking in the current folder too when it is not found elsewhere, as
    `python -m` does (the `overlapcheck` console script does not put the folder on the path, so
    `--scheduler mysched:make` would fail where `mysched.py:make` works)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = name.partition(".")[0]
        here = Path.cwd()
        if err.name != top or not ((here / f"{top}.py").is_file() or (here / top).is_dir()):
            raise
    sys.path.insert(0, str(here))
    importlib.invalidate_caches()
    return importlib.import_module(name)


@cache
def _load(text: str) -> SchedulerFactory:
    if text == REFERENCE:
        from overlapcheck.reference.scheduler import Scheduler

        return Scheduler
    module = _module(text)
    name = text.rpartition(":")[2]
    factory = getattr(module, name, None)
    if factory is None:
        where = text.rpartition(":")[0]
        raise UserError(f"--scheduler {text}: {where} has no {name}")
    if not callable(factory):
        raise UserError(f"--scheduler {text}: {name} is not callable")
    return factory  # type: ignore[no-any-return]
