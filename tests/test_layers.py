"""The layers, bottom to top, and no import circles (docs/architecture.md).

core < backends < invariants, scenarios < the harness < explore, formats, timeline, orchestrate
< commands < cli. A module may import its own layer and the ones below, nothing above. Imports
under `if TYPE_CHECKING:` count too: a type from above is a dependency on above.
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
    "errors": 0,
    "reference": 1,
    "backends": 1,
    "invariants": 2,
    "scenarios": 2,
    "runner": 3,
    "harness": 3,
    "crash": 3,
    "scheduler_spec": 3,
    "explore": 4,
    "formats": 4,
    "timeline": 4,
    "orchestrate": 4,
    "commands": 5,
    "cli": 6,
    "bench": 5,  # benchmarks are entry points beside the commands
}
# What schedulers under test may import besides their own package.
SCHEDULER_ALLOWED = {"core", "errors"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in LAYERS and rel.stem not in LAYERS:
            continue
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
        elif a == "reference" and b != "reference" and b not in SCHEDULER_ALLOWED:
            upward.append(f"{src} -> {dst} (a scheduler under test sees only the contract)")
    assert upward == []


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


def test_the_public_api_resolves() -> None:
    import overlapcheck

    missing = [name for name in overlapcheck.__all__ if not hasattr(overlapcheck, name)]
    assert missing == []
