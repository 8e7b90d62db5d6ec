"""The house keeps itself honest: registries agree with what they register, one exception
hierarchy, and package captions that name only what exists (and every subpackage)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import overlapcheck
from overlapcheck.core.errors import CheckerError, InvariantError, OverlapcheckError, UserError
from overlapcheck.invariants.registry import INVARIANTS, OPT_IN
from overlapcheck.reference.faults import FAULTS

ROOT = Path(overlapcheck.__file__).resolve().parent


def _packages() -> list[Path]:
    skip = {"tests", "build", "dist"}
    found = []
    for init in ROOT.rglob("__init__.py"):
        rel = init.relative_to(ROOT)
        if rel.parts[0] in skip or any(part.startswith(".") for part in rel.parts):
            continue
        found.append(init.parent)
    return sorted(found)


def test_every_invariant_is_registered_under_its_own_id() -> None:
    for key, make in INVARIANTS.items():
        assert make().id == key
    for key, make_opt_in in OPT_IN.items():
        assert make_opt_in("1").id == key


def test_every_fault_is_registered_under_its_own_name() -> None:
    for key, fault in FAULTS.items():
        assert fault.name == key


# Exceptions that never cross the command boundary: control flow inside one module, or findings
# about the scheduler (InvariantError and its kin are the scheduler's, not overlapcheck's).
_INTERNAL = {
    "overlapcheck.explore.search.Found",  # a search's own signal to stop, caught in search()
    "overlapcheck.invariants.base.InvariantViolated",  # a violation on its way to the harness
    "overlapcheck.adapters.minisgl.cuda._Done",  # the GPU run's end, caught in CudaRun.run()
    "overlapcheck.backends.torchsim.tensor.SimulatedCudaError",  # scheduler misuse of CUDA
    "overlapcheck.harness.crash.RemoteCrash",  # a rank's exception from its process: no-crash
}


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages([str(ROOT)], prefix="overlapcheck."):
        name = info.name
        if name.startswith(("overlapcheck.tests", "overlapcheck.build")) or name.endswith(
            "__main__"
        ):
            continue
        names.append(name)
    return names


def test_every_exception_overlapcheck_raises_derives_from_one_hierarchy() -> None:
    strays = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional extra (ray, flashinfer) that is not installed
            continue
        for attr, value in vars(module).items():
            # BaseException-only classes (watchdog, budget, interrupt signals) are control flow.
            if not (inspect.isclass(value) and issubclass(value, Exception)):
                continue
            if value.__module__ != name:
                continue
            if attr.startswith("_"):
                continue  # module-private control flow (an adapter's idle signal), caught there
            qual = f"{name}.{attr}"
            if qual in _INTERNAL or issubclass(value, (OverlapcheckError, InvariantError)):
                continue
            strays.append(qual)
    assert strays == []


def test_bad_input_errors_are_user_errors_and_our_bugs_are_checker_errors() -> None:
    from overlapcheck.backends.sim.timing import ProfileError
    from overlapcheck.core.config import ConfigError
    from overlapcheck.harness.crash import CheckerBug
    from overlapcheck.reference.faults import UnknownFaultError
    from overlapcheck.scenarios.loader import ScenarioError

    for bad_input in (ConfigError, ScenarioError, ProfileError, UnknownFaultError):
        assert issubclass(bad_input, UserError) and issubclass(bad_input, ValueError)
    assert issubclass(CheckerBug, CheckerError)
    assert not issubclass(UserError, CheckerError)


_PATHLIKE = re.compile(r"`([\w./-]+(?:\.py|/))`")


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)) or ".")
def test_a_package_caption_names_only_what_exists_and_every_subpackage(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert doc, "every package says what it holds"
    for named in _PATHLIKE.findall(doc):
        here = [package / named, ROOT / named]
        assert any(p.exists() for p in here), f"{package.name}: names {named}, which is gone"
    if package == ROOT:
        return  # the top-level folders are the layers (tests/test_layers.py)
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        assert re.search(rf"`{sub.name}/?`", doc), f"{package.name} never names `{sub.name}/`"
