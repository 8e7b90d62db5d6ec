"""The layers, bottom to top, and no import circles (docs/architecture.md).

core < reference, examples, backends, invariants < scenarios, adapters < harness < explore,
formats, timeline, replay, calibrate < commands, bench < cli. A module may import its own layer
and the ones below, nothing above. Imports under `if TYPE_CHECKING:` count too: a type from
above is a dependency on above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent

# Top-level package or module -> layer. The reference scheduler and the examples are schedulers
# under test: they see only the contract (core).
LAYERS: dict[str, int] = {
    "core": 0,
    "reference": 1,
    "backends": 1,
    "invariants": 1,  # the checks read evidence from core only (trace, KV shadow, expected)
    "scenarios": 2,
    "adapters": 2,  # upstream schedulers on the simulated CUDA (backends/torchsim)
    "harness": 3,
    "explore": 4,
    "formats": 4,
    "timeline": 4,
    "replay": 4,  # replays of a counterexample (simulator, GPU, cluster)
    "calibrate": 4,  # the simulator fitted to a GPU
    "commands": 5,
    "cli": 6,
    "bench": 5,  # benchmarks are entry points beside the commands
    "examples": 1,  # schedulers under test, shipped so that a wheel user can name them
}
# What schedulers under test may import besides their own package.
SCHEDULER_ALLOWED = {"core"}
SCHEDULERS = {"reference", "examples"}


def package_files(folder: Path) -> list[Path]:
    """The modules of the package in `folder` and its subpackages: only folders with an
    `__init__.py` are entered, so a venv, `build/` or `tests/` beside the packages is not."""
    files = sorted(folder.glob("*.py"))
    for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
        files += package_files(sub)
    return files


def _modules() -> dict[str, Path]:
    out = {}
    for path in package_files(ROOT):
        rel = path.relative_to(ROOT)
        if len(rel.parts) == 1 and rel.stem not in LAYERS:
            continue  # the package's __init__ (lazy exports by name) and __main__ (calls cli)
        name = ".".join(("overlapcheck", *rel.with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("overlapcheck.")}


def _top(module: str) -> str:
    return module.split(".")[1]


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def test_no_module_imports_a_layer_above_it() -> None:
    upward = []
    for src, dst in _graph().edges:
        a, b = _top(src), _top(dst)
        if LAYERS[b] > LAYERS[a]:
            upward.append(f"{src} -> {dst}")
        elif a in SCHEDULERS and b != a and b not in SCHEDULER_ALLOWED:
            upward.append(f"{src} -> {dst} (a scheduler under test sees only the contract)")
    assert upward == []


def test_the_checks_and_the_workloads_never_reach_into_a_backend() -> None:
    """What a check reads (the trace, the KV shadow, the expected output) and what a workload is
    made of (times in `core.units`) live in core: a check judges any backend's run alike."""
    reaching = [
        f"{src} -> {dst}"
        for src, dst in _graph().edges
        if _top(src) in ("invariants", "scenarios") and _top(dst) == "backends"
    ]
    assert reaching == []


def test_no_import_circles_between_packages() -> None:
    graph = _graph()
    packages = nx.DiGraph()
    for src, dst in graph.edges:
        a, b = _top(src), _top(dst)
        if a != b:
            packages.add_edge(a, b)
    assert list(nx.simple_cycles(packages)) == []


def test_no_import_circles_between_modules() -> None:
    assert list(nx.simple_cycles(_graph())) == []


def test_every_package_and_root_module_has_a_layer() -> None:
    """A new top-level package or module is placed in the layers before anything may import it."""
    tops = {_top(name) for name in _modules() if name.count(".") >= 1}
    assert sorted(tops - set(LAYERS)) == []


def test_the_root_holds_only_the_package_face() -> None:
    """At the root: the package's face and the top-level folders, no loose modules."""
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py"]


def test_the_public_api_resolves() -> None:
    import overlapcheck

    missing = [name for name in overlapcheck.__all__ if not hasattr(overlapcheck, name)]
    assert missing == []
