"""Files stay small and functions short (the project's style): a source file of mmunlearn/, recipes/ or data_prep/
has at most 320 counted lines and a function at most 56, unless a comment line right above it starting ``# long:``
says why.

Counted lines do not depend on how the formatter lays code out: a row counts when it is not blank and does not
begin inside an open bracket, so a call or signature spread one argument per row (closing bracket on its own row)
counts once, as it does on one row. Comment rows count, and so does every row of a docstring or other multi-line
string that begins outside brackets. The limits are what the earlier rule (400 physical rows per file, 60 per
function) allowed when the formatter (``ruff format``, line length 120) came: the tree then had at most 320 counted
lines in a file and 56 in a function without a reason, so the rule is as strict as before."""

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FILE, MAX_FUNCTION = 320, 56

#: tokens that are layout, not text a reader reads
_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
_OPENING, _CLOSING = {"(", "[", "{"}, {")", "]", "}"}


def counted_rows(source: str) -> set[int]:
    """The rows (1-based) of ``source`` that count as lines: those whose first token begins outside any bracket,
    and every row of a token that spans rows outside brackets (a docstring or other multi-line string)."""
    depth = 0
    begun: set[int] = set()  # rows whose first token has been seen
    counted: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _LAYOUT:
            continue
        first_row, last_row = token.start[0], token.end[0]
        if first_row not in begun:
            begun.add(first_row)
            if depth == 0:
                counted.add(first_row)
        if depth == 0 and last_row > first_row:
            rows = range(first_row + 1, last_row + 1)
            begun.update(rows)
            counted.update(rows)
        if token.type == tokenize.OP and token.string in _OPENING:
            depth += 1
        elif token.type == tokenize.OP and token.string in _CLOSING:
            depth -= 1
    return counted


def _sources() -> list[Path]:
    return [p for d in ("mmunlearn", "recipes", "data_prep") for p in sorted((REPO / d).rglob("*.py"))]


def _long_functions(path: Path, root: Path = REPO, limit: int = MAX_FUNCTION) -> list[str]:
    """``file:line name (N lines)`` of each function over ``limit`` counted lines (its decorators included)
    without a ``# long:`` reason."""
    source = path.read_text()
    lines, rows = source.splitlines(), counted_rows(source)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = sum(1 for row in rows if first <= row <= node.end_lineno)
            reason = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if length > limit and not reason:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_source_files_are_at_most_320_counted_lines():
    sources = _sources()
    big = [f"{p.relative_to(REPO)} ({n})" for p in sources if (n := len(counted_rows(p.read_text()))) > MAX_FILE]
    assert len(sources) > 150 and big == []


def test_functions_are_at_most_56_counted_lines_or_say_why():
    assert [hit for p in _sources() for hit in _long_functions(p)] == []


def test_the_length_check_counts_decorators_and_reads_the_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION - 1))
    sample = tmp_path / "sample.py"
    sample.write_text(
        f"def short():\n    return 1\n\n\n@staticmethod\ndef too_long():\n{body}\n\n"
        f"# long: a table of many settings\n@staticmethod\ndef explained():\n{body}"
    )
    # def + body is MAX_FUNCTION rows: the decorator makes it one too many
    assert _long_functions(sample, tmp_path) == [f"sample.py:6 too_long ({MAX_FUNCTION + 1} lines)"]


COMPACT = '''
@decorator
def f(a, b, c):
    """Doc line one.

    Doc line three."""
    x = g(a, b, [c, 1])  # a comment
    return x
'''

EXPLODED = '''
@decorator
def f(
    a,
    b,
    c,
):
    """Doc line one.

    Doc line three."""

    x = g(
        a,
        b,
        [
            c,
            1,
        ],
    )  # a comment

    return x
'''


def test_the_count_ignores_bracket_continuations_and_blank_rows_but_counts_docstring_rows(tmp_path):
    # decorator, def, the docstring's three rows, the assignment, the return
    assert len(counted_rows(COMPACT)) == len(counted_rows(EXPLODED)) == 7
    assert len(EXPLODED.splitlines()) > 2 * len(COMPACT.splitlines())
    for name, text in (("compact.py", COMPACT), ("exploded.py", EXPLODED)):
        (tmp_path / name).write_text(text)
        assert _long_functions(tmp_path / name, tmp_path, limit=7) == []
        assert _long_functions(tmp_path / name, tmp_path, limit=6) == [f"{name}:3 f (7 lines)"]
    # one more docstring row is one more line; a comment row counts, a comment inside brackets does not
    assert len(counted_rows(COMPACT.replace("Doc line one.", "Doc line one.\n    More."))) == 8
    assert len(counted_rows(COMPACT.replace("    return x", "    # why\n    return x"))) == 8
    assert len(counted_rows(EXPLODED.replace("        b,\n", "        # why\n        b,\n"))) == 7
