"""No folder of the repository holds more than 12 files (issue 48: folders that show the architecture, not prefixes).
Files are counted as git would commit them (tracked and new, ignored ones left out), directly in each folder,
``__init__.py`` not counted. Data folders are exempt; a folder over the limit is a named exception with its reason
and its count when it was listed, which it may not exceed; an exception no longer needed fails too, so the list
only shrinks."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_FILES = 12

#: folders of data, not code: their size is the number of things they record
DATA = {
    "docs/results": "records, one JSON per published result (written by `mmunlearn report record`, read by the docs)",
    "docs/img": "images the docs pages show",
}

#: folders allowed over the limit: (files when listed, which is the most they may hold; why they stay)
OVER = {
    "examples": (
        16,
        "the records' commands (docs/results/*.json) run 15 of these 16 scripts by their path, and a "
        "record is not edited; moving only the one no record names would still leave 15",
    ),
    "recipes/configs/voxceleb2": (
        13,
        "a shipped config's name is its path below recipes/configs "
        "(`--config voxceleb2/NAME`), named by records and docs: a subfolder would "
        "rename the configs; each of the 13 is named by a record or a docs page",
    ),
}


def folder_counts(root: Path) -> Counter:
    """Files directly in each folder of the git checkout ``root`` (``""`` for the top), as git would commit them:
    tracked files still on disk and untracked ones that are not ignored; ``__init__.py`` is not counted."""
    listed = (
        subprocess.run(
            ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    paths = {PurePosixPath(p) for p in listed if p}
    return Counter(
        "" if p.parent == PurePosixPath(".") else str(p.parent)
        for p in paths
        if p.name != "__init__.py" and (root / p).is_file()
    )


def too_full(counts: Counter, limit: int = MAX_FILES, data: dict | None = None, over: dict | None = None) -> list[str]:
    """What breaks the rule: a folder over ``limit`` that is neither data nor a listed exception, an exception over
    its recorded count, and an exception no longer needed."""
    data, over = DATA if data is None else data, OVER if over is None else over
    found = [
        f"{folder or '.'}: {n} files (at most {limit}; split it by what its files do)"
        for folder, n in sorted(counts.items())
        if n > limit and folder not in data and folder not in over
    ]
    for folder, (most, _) in sorted(over.items()):
        if counts[folder] > most:
            found.append(f"{folder}: {counts[folder]} files, more than the {most} of its listed exception")
        elif counts[folder] <= limit:
            found.append(f"{folder}: {counts[folder]} files, within the limit: remove its exception")
    return found


needs_git = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="the files are counted in a git checkout"
)


@needs_git
def test_no_folder_holds_more_than_12_files():
    counts = folder_counts(REPO)
    assert counts["tests"] > 0 and counts["mmunlearn"] > 0  # the listing saw the repository
    assert too_full(counts) == []


def test_every_exempt_and_excepted_folder_exists_and_says_why():
    for folder, why in [*DATA.items(), *((f, w) for f, (_, w) in OVER.items())]:
        assert (REPO / folder).is_dir() and len(why) > 20, folder
    assert all(most > MAX_FILES for most, _ in OVER.values())


def test_the_rule_flags_a_full_folder_a_grown_exception_and_a_stale_one():
    counts = Counter({"": 3, "a": 13, "b": 12, "data": 90, "grown": 15, "stale": 12, "kept": 14})
    over = {"grown": (14, "why"), "stale": (13, "why"), "kept": (14, "why")}
    assert too_full(counts, 12, {"data": "why"}, over) == [
        "a: 13 files (at most 12; split it by what its files do)",
        "grown: 15 files, more than the 14 of its listed exception",
        "stale: 12 files, within the limit: remove its exception",
    ]


@needs_git
def test_the_count_is_what_git_would_commit(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored.txt\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "ignored.txt"):
        (tmp_path / "pkg" / name).write_text("")
    (tmp_path / "pkg" / "sub" / "c.py").write_text("")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text("")
    (tmp_path / "gone.py").write_text("")
    subprocess.run(["git", "-C", str(tmp_path), "add", "pkg/a.py", "gone.py"], check=True)
    (tmp_path / "gone.py").unlink()  # tracked but deleted: not counted
    # "": .gitignore; pkg: a.py tracked, b.py new
    assert folder_counts(tmp_path) == Counter({"": 1, ".ci": 1, "pkg": 2, "pkg/sub": 1})
