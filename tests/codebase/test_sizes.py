"""Files stay small and functions short (the project's style): a source file of mmunlearn/, recipes/ or data_prep/
is at most 400 lines and a function at most 60, unless a comment line right above it starting ``# long:`` says why."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FILE, MAX_FUNCTION = 400, 60


def _sources() -> list[Path]:
    return [p for d in ("mmunlearn", "recipes", "data_prep") for p in sorted((REPO / d).rglob("*.py"))]


def _long_functions(path: Path, root: Path = REPO) -> list[str]:
    """``file:line name (N lines)`` of each function over :data:`MAX_FUNCTION` lines without a ``# long:`` reason."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            reason = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if length > MAX_FUNCTION and not reason:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_source_files_are_at_most_400_lines():
    sources = _sources()
    big = [f"{p.relative_to(REPO)} ({n})" for p in sources if (n := len(p.read_text().splitlines())) > MAX_FILE]
    assert len(sources) > 150 and big == []


def test_functions_are_at_most_60_lines_or_say_why():
    assert [hit for p in _sources() for hit in _long_functions(p)] == []


def test_the_length_check_counts_decorators_and_reads_the_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    sample = tmp_path / "sample.py"
    sample.write_text(
        f"def short():\n    return 1\n\n\n@staticmethod\ndef too_long():\n{body}\n\n"
        f"# long: a table of sixty settings\n@staticmethod\ndef explained():\n{body}"
    )
    assert _long_functions(sample, tmp_path) == ["sample.py:6 too_long (61 lines)"]
