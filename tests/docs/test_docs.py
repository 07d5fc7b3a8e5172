"""The docs hold together: every relative link resolves, every generated table agrees with its record,
and the site builds with mkdocs --strict."""

import re
import subprocess
import sys
from pathlib import Path

from mmunlearn import report

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_no_page_points_outside_the_repository():
    outside = [
        f"{p.relative_to(ROOT)} -> {t}"
        for p in PAGES
        for t in LINK.findall(p.read_text())
        if not re.match(r"[a-z]+://|#", t) and not (p.parent / t.split("#")[0]).resolve().is_relative_to(ROOT)
    ]
    assert outside == []


def test_every_generated_table_agrees_with_its_record():
    assert report.stale_blocks(PAGES, ROOT / "docs" / "results") == []
    assert any(report.BLOCK.search(p.read_text()) for p in PAGES)  # there are generated tables to check


def test_the_readme_stays_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_site_builds_strictly(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
            "--config-file",
            str(ROOT / "mkdocs.yml"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "site" / "tofu" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text()  # generated from the code (mmunlearn/cli/apiref.py)
    assert _api_page_misses(api) == []


def _api_page_misses(page: str) -> list[str]:
    """What the API reference page lacks: a public function's name or a parameter of it, a method, a kind."""
    import importlib
    import inspect

    from mmunlearn.cli.apiref import FUNCTIONS
    from mmunlearn.kinds import kind_names
    from mmunlearn.methods import names

    missing = []
    for _, entries in FUNCTIONS:
        for title, module, name in entries:
            params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
            missing += [f"{title}: {p}" for p in [title.split()[0], *params] if p not in page]
    missing += [f"method {m}" for m in names() if f"<code>{m}</code>" not in page]
    missing += [f"kind {k}" for k in kind_names() if f"<code>{k}</code>" not in page]
    return missing


def test_the_api_check_sees_a_missing_parameter():
    from mmunlearn.cli.apiref import render

    page = render()  # the Markdown: its parameters are in it as in the built page
    assert "forget_level" in page and "prompt_format" in page
    assert any("forget_level" in m for m in _api_page_misses(page.replace("forget_level", "level")))


def _tables_outside_blocks(text: str) -> list[int]:
    """Line numbers of table rows that are neither in a code fence, nor in a generated results block, nor in a
    table declared as reference (not results) by a ``<!-- reference table: why -->`` line right above it."""
    rows, fence, block, reference, previous = [], False, False, False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        elif line.startswith("<!-- results:"):
            block = True
        elif line.startswith("<!-- /results"):
            block = False
        elif line.startswith("|"):
            reference = reference or previous.startswith("<!-- reference table:")
            if not (fence or block or reference):
                rows.append(number)
        else:
            reference = False
        previous = line
    return rows


def test_every_table_is_generated_from_a_record():
    loose = {str(p.relative_to(ROOT)): rows[:3] for p in PAGES if (rows := _tables_outside_blocks(p.read_text()))}
    assert loose == {}, "tables written by hand (not generated from docs/results/): " + repr(loose)


def test_the_table_finder_sees_a_hand_written_table():
    page = (
        "text\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<!-- results: x -->\n| c |\n<!-- /results -->\n```\n| d |\n```\n"
        "<!-- reference table: options -->\n| e |\n| f |\n\n| g |\n"
    )
    assert _tables_outside_blocks(page) == [3, 4, 5, 17]


ARCHITECTURE = ROOT / "ARCHITECTURE.md"
#: Repository paths as ARCHITECTURE.md writes them: a folder or file, a test file with an optional ``::test_name``.
REPO_PATH = re.compile(
    r"(?<![\w/.])((?:mmunlearn|recipes|data_prep|examples|tests|docs)/[\w./-]*(?:::\w+)?)(?![\w./:<-])"
)


def _architecture_misses(text: str, root: Path) -> list[str]:
    """What makes ARCHITECTURE.md a stale map of the repository at ``root``: over 150 lines, a path it names that
    does not exist (a template such as ``recipes/<bench>/cli.py`` is skipped), a ``tests/...py::name`` whose file
    defines no such test, a package (folder with ``__init__.py``) or root module of ``mmunlearn/`` it leaves out."""
    misses = [f"{len(text.splitlines())} lines"] if len(text.splitlines()) > 150 else []
    for found in REPO_PATH.findall(text):
        path, _, name = found.rstrip(".").partition("::")
        if not (root / path).exists():
            misses.append(f"no {path}")
        elif name and not re.search(rf"^(async )?def {name}\(", (root / path).read_text(), re.M):
            misses.append(f"no {name} in {path}")
    packages = [p.parent for d in ("mmunlearn", "recipes", "data_prep") for p in (root / d).rglob("__init__.py")]
    named = [f"{p.relative_to(root).as_posix()}/" for p in packages if p != root / "mmunlearn"]
    named += [p.relative_to(root).as_posix() for p in (root / "mmunlearn").glob("*.py")] + ["examples/"]
    return misses + [f"leaves out {n}" for n in sorted(named) if f"`{n}`" not in text]


def test_architecture_md_is_a_short_map_of_what_exists():
    text = ARCHITECTURE.read_text()
    assert _architecture_misses(text, ROOT) == []
    found = REPO_PATH.findall(text)  # the check reads the map's paths, the layering tests' among them
    assert len(found) > 80 and any(p.endswith("/test_layers.py") for p in found)


def test_the_map_check_sees_a_stale_path_a_missing_test_and_a_package_left_out(tmp_path):
    for folder in ("mmunlearn/api", "tests"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "mmunlearn" / "__init__.py").write_text("")
    (tmp_path / "mmunlearn" / "api" / "__init__.py").write_text("")
    (tmp_path / "mmunlearn" / "kinds.py").write_text("")
    (tmp_path / "examples").mkdir()
    (tmp_path / "tests" / "test_api.py").write_text("def test_one():\n    pass\n")
    page = (
        "- `mmunlearn/__init__.py`, `mmunlearn/kinds.py`, `examples/`: `tests/test_api.py::test_one`, "
        "`recipes/<bench>/cli.py`, `tests/test_<bench>.py`\n"
    )
    assert _architecture_misses(page, tmp_path) == ["leaves out mmunlearn/api/"]
    stale = page + "- `mmunlearn/api/`: `tests/test_api.py::test_two`, `mmunlearn/gone/`, tests/test_gone.py.\n"
    assert _architecture_misses(stale + "\n" * 150, tmp_path) == [
        "152 lines",
        "no test_two in tests/test_api.py",
        "no mmunlearn/gone/",
        "no tests/test_gone.py",
    ]
