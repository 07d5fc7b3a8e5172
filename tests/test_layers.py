"""The package's layers point one way: no import of recipes/ from mmunlearn/, no import cycle between packages."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mmunlearn"


def _imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges[module].add(node.module)
            elif isinstance(node, ast.Import):
                edges[module].update(a.name for a in node.names)
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (ROOT / parts[1]).is_dir() else module


def test_the_library_never_imports_the_recipes():
    bad = sorted(f"{m} -> {t}" for m, targets in _imports().items() for t in targets
                 if t == "recipes" or t.startswith("recipes."))
    assert bad == []


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in _imports().items():
        for t in targets:
            if t.startswith("mmunlearn.") and _package(t) != _package(module) and _package(module) != "mmunlearn":
                graph[_package(module)].add(_package(t))

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(p for p in graph if p in reach(p))
    assert cycles == [], f"packages on an import cycle: {cycles}"
    assert reach("mmunlearn.adapters").isdisjoint({"mmunlearn.tilt", "mmunlearn.methods", "mmunlearn.presets"})
