"""The package's layers point one way: no import of recipes/ from mmunlearn/ or data_prep/, none of data_prep/ from
mmunlearn/ (a benchmark flow that prepares data is a recipe: ``bench requests``), no import cycle between
the packages and root modules of mmunlearn/ and data_prep/, no submodule importing the package face."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "mmunlearn"
DATA_PREP = ROOT.parent / "data_prep"


def _imports(*roots: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports (at the top or in a function body), for the .py files under ``roots``."""
    edges: dict[str, set[str]] = defaultdict(set)
    for root in roots or (ROOT,):
        for path in root.rglob("*.py"):
            module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    edges[module].add(node.module)
                    if node.module == "mmunlearn":  # `from mmunlearn import layout` imports a submodule
                        edges[module].update(f"mmunlearn.{a.name}" for a in node.names if _is_submodule(a.name))
                elif isinstance(node, ast.Import):
                    edges[module].update(a.name for a in node.names)
    return edges


def _is_submodule(name: str) -> bool:
    return (ROOT / f"{name}.py").is_file() or (ROOT / name).is_dir()


def _package(module: str) -> str:
    """The node of ``module`` in the layer graph: a package of mmunlearn/ (``mmunlearn.erase``), a root module
    (``mmunlearn.kinds``), or data_prep as one package."""
    parts = module.split(".")
    if parts[0] == "data_prep":
        return "data_prep"
    return ".".join(parts[:2]) if len(parts) > 1 and (ROOT / parts[1]).is_dir() else module


def test_the_library_never_imports_the_recipes():
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in _imports().items()
        for t in targets
        if t == "recipes" or t.startswith("recipes.")
    )
    assert bad == []


def test_the_library_never_imports_data_prep():
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in _imports().items()
        for t in targets
        if t == "data_prep" or t.startswith("data_prep.")
    )
    assert bad == []


def test_data_prep_never_imports_the_recipes():
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in _imports(DATA_PREP).items()
        for t in targets
        if t == "recipes" or t.startswith("recipes.")
    )
    assert bad == []


def test_no_submodule_imports_the_package_face():
    """``mmunlearn/__init__.py`` sits above every submodule: none imports it for a name it defines (e.g. the version,
    in ``mmunlearn/_version.py``); ``from mmunlearn import layout`` names a submodule and is allowed."""
    bad = []
    for path in ROOT.rglob("*.py"):
        if path == ROOT / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "mmunlearn" for a in node.names):
                bad.append(f"{path.relative_to(ROOT.parent)}: import mmunlearn")
            elif isinstance(node, ast.ImportFrom) and node.module == "mmunlearn" and node.level == 0:
                bad += [
                    f"{path.relative_to(ROOT.parent)}: from mmunlearn import {a.name}"
                    for a in node.names
                    if not _is_submodule(a.name)
                ]
    assert bad == []


def _layer_graph() -> dict[str, set[str]]:
    """Package (or root module) -> the packages and root modules of mmunlearn/ and data_prep/ it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in _imports(ROOT, DATA_PREP).items():
        for t in targets:
            if (
                (t.startswith("mmunlearn.") or t.startswith("data_prep"))
                and _package(t) != _package(module)
                and _package(module) != "mmunlearn"
            ):
                graph[_package(module)].add(_package(t))
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycle_between_packages():
    graph = _layer_graph()
    cycles = sorted(p for p in graph if p in _reach(graph, p))
    assert cycles == [], f"packages on an import cycle: {cycles}"
    assert {"mmunlearn.api", "mmunlearn.files", "mmunlearn.cli", "mmunlearn.bench", "data_prep"} <= set(graph)
    # the kind registry imports nothing of the package (it loads the adapters by name): every layer may use it
    assert not [t for t in _imports()["mmunlearn.kinds"] if t.startswith("mmunlearn")]
    assert "mmunlearn.bench" not in _reach(graph, "data_prep")


def test_the_adapters_import_no_layer_above_them():
    """adapters/ sits below erasure, T3, the methods and the presets: it imports none of them, directly or through
    another package (what both sides need, e.g. the parameter-name grouping ``group_of``, lives in a neutral root
    module: mmunlearn/naming.py)."""
    above = {"mmunlearn.erase", "mmunlearn.tilt", "mmunlearn.methods", "mmunlearn.presets"}
    direct = sorted(
        f"{m} -> {t}" for m, targets in _imports(ROOT / "adapters").items() for t in targets if _package(t) in above
    )
    assert direct == []
    assert _reach(_layer_graph(), "mmunlearn.adapters").isdisjoint(above)


def test_every_benchmark_is_laid_out_as_architecture_md_says():
    """A benchmark is a recipe: each entry point of the ``mmunlearn.recipes`` group is ``recipes.<bench>:app``, the app
    of ``recipes/<bench>/cli.py`` (the package reads it on first use), beside ``recipes/<bench>/config.py`` and at least
    one ``recipes/configs/<bench>/*.yaml``, and it runs its methods through the one runner (``run_method`` /
    ``run_comparison``); ARCHITECTURE.md lists those files for a new one."""
    import importlib
    import tomllib

    repo = ROOT.parent
    groups = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["entry-points"]
    benchmarks = groups["mmunlearn.recipes"]
    assert {"tofu", "ctofu", "voxceleb2"} <= set(benchmarks)
    for bench, target in benchmarks.items():
        assert target == f"recipes.{bench}:app", target
        recipe = repo / "recipes" / bench / "cli.py"
        assert recipe.is_file() and (repo / "recipes" / bench / "config.py").is_file()
        assert importlib.import_module(f"recipes.{bench}").app is importlib.import_module(f"recipes.{bench}.cli").app
        assert list((repo / "recipes" / "configs" / bench).glob("*.yaml")), bench
        names = {
            n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(ast.parse(recipe.read_text()))
            if isinstance(n, (ast.Name, ast.Attribute))
        }
        assert "run_comparison" in names, f"{bench} compares its methods outside runner.run_comparison"
    text = (repo / "ARCHITECTURE.md").read_text()
    assert all(
        f in text
        for f in (
            "recipes/<bench>/cli.py",
            "recipes/<bench>/config.py",
            "recipes/configs/<bench>/*.yaml",
            "`mmunlearn.recipes` entry points",
        )
    )


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of mmunlearn/, data_prep/ and recipes/ it imports, one node per file (``from pkg import
    mod`` is an edge to ``pkg.mod``; an imported name that is not a module, to the module that defines it)."""
    repo = ROOT.parent

    def module_of(dotted: str) -> str | None:
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            here = repo.joinpath(*parts[:i])
            if here.with_suffix(".py").is_file() or (here / "__init__.py").is_file():
                return ".".join(parts[:i])
        return None

    graph: dict[str, set[str]] = defaultdict(set)
    for root in (ROOT, DATA_PREP, repo / "recipes"):
        for path in root.rglob("*.py"):
            module = ".".join(path.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    ours = name.split(".")[0] in ("mmunlearn", "data_prep", "recipes")
                    if ours and (target := module_of(name)) != module:
                        graph[module].add(target)
    return graph


def test_no_import_cycle_between_modules():
    """Below the packages, no two modules import each other, directly or around a loop: each file's imports point
    down too (the layers the root modules used to be -- atomic, checkpoint, undo_store, api, loader, ... -- are
    packages now, files/, api/, report/, cli/, whose modules keep that order among themselves)."""
    graph = _module_graph()
    assert {"mmunlearn.files.checkpoint", "mmunlearn.api.unlearn"} <= set(graph) and len(graph) > 150
    assert "mmunlearn.files.atomic" in graph["mmunlearn.files.checkpoint"]
    assert "recipes.tofu.config" in graph["recipes.tofu.pipeline"]  # the recipes' files are nodes too
    cycles = sorted(m for m in graph if m in _reach(graph, m))
    assert cycles == [], f"modules on an import cycle: {cycles}"


def _drawn_layers(text: str) -> list[list[str]]:
    """The rows of the first code block under ARCHITECTURE.md's ``## Layers``, top first, as graph nodes
    (``cli/`` -> ``mmunlearn.cli``, ``config.py`` -> ``mmunlearn.config``, ``data_prep/`` -> ``data_prep``)."""
    block = text.split("\n## Layers\n", 1)[1].split("```", 2)[1]
    node = {"data_prep": "data_prep"}
    return [
        [node.get(n, f"mmunlearn.{n}") for n in (w.removesuffix("/").removesuffix(".py") for w in line.split())]
        for line in block.splitlines()
        if line.strip()
    ]


def _against_drawing(rows: list[list[str]], graph: dict[str, set[str]], nodes: set[str]) -> list[str]:
    """Where the import graph and the drawn rows disagree: a node drawn twice or not at all, a drawn name that is no
    node, an import of a node in the same row or a row above."""
    level = {n: i for i, row in enumerate(rows) for n in row}
    drawn = [n for row in rows for n in row]
    problems = [f"{n} drawn twice" for n in sorted({n for n in drawn if drawn.count(n) > 1})]
    problems += [f"{n} not drawn" for n in sorted(nodes - set(level))]
    problems += [f"{n} drawn but not in the package" for n in sorted(set(level) - nodes)]
    return problems + sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if m in level and t in level and level[t] <= level[m]
    )


def test_the_layers_are_as_architecture_md_draws_them():
    """ARCHITECTURE.md's layer drawing is the import graph's: every package and root module of mmunlearn/ (and
    data_prep/) sits in one row and imports only rows below it."""
    rows = _drawn_layers((ROOT.parent / "ARCHITECTURE.md").read_text())
    nodes = {f"mmunlearn.{p.stem}" for p in ROOT.glob("*.py") if p.stem != "__init__"}
    nodes |= {f"mmunlearn.{p.parent.name}" for p in ROOT.glob("*/__init__.py")} | {"data_prep"}
    graph = _layer_graph()
    assert set(graph) <= nodes and len(rows) > 10
    assert _against_drawing(rows, graph, nodes) == []


def test_the_drawing_check_sees_an_upward_import_and_a_package_left_out():
    rows = _drawn_layers("# x\n\n## Layers\n\ntext\n\n```\napi/  cli/\nfiles/\nkinds.py\n```\n\n## Map\n")
    assert rows == [["mmunlearn.api", "mmunlearn.cli"], ["mmunlearn.files"], ["mmunlearn.kinds"]]
    nodes = {"mmunlearn.api", "mmunlearn.cli", "mmunlearn.files", "mmunlearn.kinds", "mmunlearn.report"}
    graph = {
        "mmunlearn.api": {"mmunlearn.files"},
        "mmunlearn.files": {"mmunlearn.api"},
        "mmunlearn.cli": {"mmunlearn.api"},
    }
    assert _against_drawing(rows, graph, nodes) == [
        "mmunlearn.report not drawn",
        "mmunlearn.cli -> mmunlearn.api",
        "mmunlearn.files -> mmunlearn.api",
    ]
