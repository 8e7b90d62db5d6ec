"""Whose a source file is: the scheduler's, overlapcheck's, or a library's.

Three questions turn on it: which frame of a traceback owns a crash (`harness/crash.py`), which
frame of the scheduler's made a device call (`core/sites.py`), and which loaded modules are the
scheduler's code that a replay compares (`harness/fingerprint.py`).

    owner(Path("/usr/lib/python3.11/heapq.py"))                 # "library"
    owner(Path(".../overlapcheck/harness/runner.py"))           # "checker"
    owner(Path(".../overlapcheck/reference/scheduler.py"))      # "shipped"
    owner(Path("/home/me/engine/scheduler.py"))                 # "scheduler"
    owner(Path(".../site-packages/vllm/x.py"), (vllm_root,))    # "scheduler": a code root
"""

from __future__ import annotations

import site
import sysconfig
from functools import cache
from pathlib import Path
from typing import Literal

# "scheduler": the scheduler's own (a user's file, an upstream engine's tree, a declared code
# root); "shipped": a scheduler overlapcheck ships (the reference, the examples), the scheduler's
# code when it is the one under test; "checker": overlapcheck's machinery; "library": Python's
# and third-party libraries, and code with no file (`<frozen ...>`, `<string>`).
Owner = Literal["scheduler", "shipped", "checker", "library"]

PACKAGE = Path(__file__).resolve().parent.parent  # overlapcheck's root: this file is in core/
SHIPPED_FOLDERS = (PACKAGE / "reference", PACKAGE / "examples")


def _library_folders() -> tuple[Path, ...]:
    """Folders of the Python installation and its third-party libraries."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = {sysconfig.get_paths().get(key) for key in keys}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    # (not the prefixes themselves: code of one's own may live under /usr/local, say)
    return tuple(sorted({Path(p).resolve() for p in paths if p}))


LIBRARY_FOLDERS = _library_folders()


def _own_parts() -> frozenset[str]:
    """The names directly under the package that are overlapcheck's: its modules, its
    subpackages, and the tests. In a checkout the package is the repository's root, where a
    user may keep other code (an engine's tree unpacked beside ours, say): that is theirs."""
    try:
        entries = list(PACKAGE.iterdir())
    except OSError:
        return frozenset()
    return frozenset(
        {e.name for e in entries if e.suffix == ".py" or (e / "__init__.py").is_file()} | {"tests"}
    )


OWN_PARTS = _own_parts()


def _ours(path: Path) -> bool:
    if not path.is_relative_to(PACKAGE):
        return False
    parts = path.relative_to(PACKAGE).parts
    return bool(parts) and parts[0] in OWN_PARTS


@cache
def owner(path: Path, code_roots: tuple[Path, ...] = ()) -> Owner:
    """Whose the (resolved) source file `path` is. `code_roots`: folders the scheduler declares
    as its code (`core/protocol.py`: `code_roots()`), its own even inside site-packages."""
    if any(path.is_relative_to(root) for root in code_roots):
        return "scheduler"
    # The package may live in a library folder (installed from a wheel) and a library folder may
    # live in the package (a virtual environment inside the checkout): the innermost counts.
    if _ours(path) and not any(
        folder.is_relative_to(PACKAGE) and path.is_relative_to(folder) for folder in LIBRARY_FOLDERS
    ):
        return "shipped" if any(path.is_relative_to(f) for f in SHIPPED_FOLDERS) else "checker"
    if path.name.startswith("<") or any(path.is_relative_to(f) for f in LIBRARY_FOLDERS):
        return "library"
    return "scheduler"


def runs_the_scheduler(path: Path) -> bool:
    """Whether a frame in `path` is the scheduler under test's, whichever it is (its own or one
    overlapcheck ships)."""
    return owner(path) in ("scheduler", "shipped")
