"""Issue 33, low items on ``mmunlearn report``: git is run in the package's own checkout with no file-system monitor
(a repository in the working directory whose ``core.fsmonitor`` names a program does not run it), a cell larger than
``MAX_CELL`` is refused at once, and a run JSON that is a list, holds rows of numbers or is nested 200,000 deep is
one ``error:`` line naming the file. Inputs stay byte-identical; nothing is written but the record."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from mmunlearn.report import MAX_CELL, git_commit, make_record
from tests.reliability.untrusted import digest_tree, listing, run_cli, run_cli_here


@pytest.fixture
def hostile_repo(tmp_path) -> tuple[Path, Path]:
    """A git repository whose config names a file-system monitor that leaves a mark when it runs."""
    repo, mark = tmp_path / "repo", tmp_path / "fsmonitor-ran"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {mark}\n")
    hook.chmod(0o755)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", str(hook)], check=True)
    subprocess.run(["git", "-C", str(repo), "status", "-s"], check=True, capture_output=True)
    assert mark.exists()  # the monitor does run for a plain git
    mark.unlink()
    assert not mark.exists()
    return repo, mark


def test_the_commit_is_read_without_running_a_repository_s_fsmonitor(hostile_repo, monkeypatch):
    repo, mark = hostile_repo
    monkeypatch.chdir(repo)
    git_commit()  # the package's own checkout, not the working directory's
    assert not mark.exists()
    assert git_commit(repo) is not None and not mark.exists()  # even asked for that repository


def test_report_record_in_a_hostile_repository_runs_nothing(hostile_repo, tmp_path):
    repo, mark = hostile_repo
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"rows": [{"method": "a", "score": 1.0}]}))
    res = run_cli(
        "report",
        "record",
        str(run),
        "--name",
        "x",
        "--command",
        "c",
        "--out",
        str(tmp_path / "res"),
        env={"GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert not mark.exists() and (tmp_path / "res" / "x.json").is_file()


def test_a_huge_cell_is_refused_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        make_record({"rows": [{"method": "x" * (50 * MAX_CELL)}]}, name="n", command="c", commit="abc")
    assert "row 0 column 'method'" in str(err.value) and f"{MAX_CELL:,}" in str(err.value)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "content, needle",
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"rows": [1, 2, 3]}', "'rows': a list of"),
        ('{"rows": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    ],
)
@pytest.mark.parametrize("command", ["record", "render"])
def test_a_malformed_run_json_is_one_error_line_naming_the_file(tmp_path, content, needle, command):
    run = tmp_path / "run.json"
    run.write_text(content)
    before = digest_tree(tmp_path)
    extra = ["--name", "x", "--command", "c", "--out", str(tmp_path / "res")] if command == "record" else []
    res = run_cli_here("report", command, str(run), *extra)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.stderr[-2000:]
    assert needle in lines[0] and str(run) in lines[0], lines
    assert digest_tree(tmp_path) == before and listing(tmp_path) == {"run.json"}
