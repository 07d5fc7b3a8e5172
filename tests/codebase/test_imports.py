"""Imports sit at module top (issue 25 item 5): an import of the project's own code (``mmunlearn``, ``recipes``,
``data_prep``, or relative) inside a function body is allowed only with a ``# deferred: <why>`` comment on its
line -- an import cycle, an optional or heavy dependency kept out of a light import (``import mmunlearn``, the
CLI's start, the corpus workers), never by habit."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("mmunlearn", "recipes", "data_prep")


def _internal(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in PACKAGES
    return any(a.name.split(".")[0] in PACKAGES for a in node.names)


def function_level_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of each internal import inside a function body of ``source`` without a ``# deferred:``
    comment on one of its lines."""
    lines = source.splitlines()
    bad = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)) and _internal(child):
                text = lines[child.lineno - 1 : child.end_lineno]
                if not any("# deferred:" in line and line.split("# deferred:", 1)[1].strip() for line in text):
                    bad.append((child.lineno, text[0].strip()))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(source), False)
    return bad


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_internal_imports_are_at_module_top_unless_marked_deferred():
    bad = [
        f"{path.relative_to(REPO)}:{line}: {text}"
        for path in _modules()
        for line, text in function_level_imports(path.read_text())
    ]
    assert bad == [], "move these imports to module top, or say why not with `# deferred: <why>`:\n" + "\n".join(bad)


def test_the_check_sees_function_level_imports():
    source = """
from mmunlearn.errors import UserError


def f():
    from mmunlearn.api.unlearn import unlearn
    from .sibling import x
    import recipes.tofu
    import json
    from data_prep.fsdd import (a,
                                b)  # deferred: cycle with data_prep
    from mmunlearn.tilt import TiltHead  # deferred: transformers

    class C:
        def g(self):
            from mmunlearn.methods import get  # deferred:
"""
    assert [line for line, _ in function_level_imports(source)] == [6, 7, 8, 16]


def test_the_check_covers_every_package():
    names = {p.relative_to(REPO).parts[0] for p in _modules()}
    assert names == set(PACKAGES)
    assert REPO / "recipes" / "tofu" / "cli.py" in _modules()
    assert REPO / "recipes" / "voxceleb2" / "cli.py" in _modules()
