"""Every argparse option of the project's scripts (data_prep, examples, library, recipes) carries help text."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("data_prep", "examples", "mmunlearn", "recipes")


def options_without_help(source: str) -> list[str]:
    """``add_argument`` calls in ``source`` with no ``help=`` (as ``line: call``)."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and not any(k.arg == "help" for k in node.keywords)
        ):
            missing.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return missing


def test_the_scan_finds_an_option_without_help():
    source = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--a', help='x')\np.add_argument('--b')\n"
    assert options_without_help(source) == ["4: p.add_argument('--b')"]


def test_every_argparse_option_has_help():
    missing = {
        str(path.relative_to(ROOT)): found
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (found := options_without_help(path.read_text()))
    }
    assert not missing, f"argparse options without help: {missing}"
