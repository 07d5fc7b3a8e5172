"""Issue 33, low items on outputs: side files of an input named like an output's own files (``unlearn_report.json``,
``undo_history/``, ``tilt/``) are not copied into an erase output (``restore`` would read them as ours), and
``mmunlearn audit`` without ``--out`` writes under the current directory, never beside the model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.files.layout import ERASE_REPORT, HISTORY_DIR, MARKER, PATCH_NAME, TILT_DIR, UNLEARN_REPORT
from tests.reliability.untrusted import digest_tree, listing, make_checkpoint, make_forget

FORGED = {"method": "grad_ascent", "requests": [{"index": 1}, {"index": 2}]}


def _plant(model: Path) -> None:
    (model / UNLEARN_REPORT).write_text(json.dumps(FORGED))
    (model / HISTORY_DIR).mkdir()
    (model / HISTORY_DIR / "request-0001.json").write_text(json.dumps(FORGED))
    (model / TILT_DIR).mkdir()
    (model / TILT_DIR / "tilt_config.json").write_text("{}")
    (model / "README.md").write_text("a side file that is the model's own")


@pytest.mark.parametrize(
    "erase",
    [
        lambda m, f, o: stream_erase_checkpoint(m, f, o, rank=2, progress=False),
        lambda m, f, o: erase_checkpoint(m, f, o, rank=2),
    ],
    ids=["stream", "in-memory"],
)
def test_side_files_named_like_our_outputs_are_not_copied_into_an_erase_output(tmp_path, erase):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    _plant(model)
    before = digest_tree(model)
    erase(model, forget, tmp_path / "out")
    written = listing(tmp_path / "out")
    assert {UNLEARN_REPORT, HISTORY_DIR, TILT_DIR}.isdisjoint(written), written
    assert {"README.md", ERASE_REPORT, MARKER} <= written  # the model's own side files still are
    assert PATCH_NAME not in written and (tmp_path / "out.undo" / PATCH_NAME).is_file()  # the patch is kept apart
    assert (tmp_path / "out" / "README.md").read_text() == "a side file that is the model's own"
    assert digest_tree(model) == before and listing(tmp_path) == {"model", "forget.safetensors", "out", "out.undo"}


def test_audit_without_out_writes_under_the_current_directory(tmp_path, monkeypatch):
    from mmunlearn.cli import audit_destination

    monkeypatch.chdir(tmp_path)
    assert audit_destination(None) == tmp_path / "audit"
    assert audit_destination(Path("/elsewhere/x")) == Path("/elsewhere/x")


@pytest.mark.parametrize(
    "content, needle",
    [
        ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
        ('{"method": 3}', "no 'method'"),
        ("\xff{", "not valid JSON"),
    ],
)
def test_an_audit_of_a_folder_with_a_malformed_report_is_one_error_naming_it(tmp_path, content, needle):
    from tests.reliability.untrusted import run_cli_here as run_cli

    model = tmp_path / "model"
    model.mkdir()
    (model / UNLEARN_REPORT).write_bytes(content.encode("latin-1"))
    before = digest_tree(tmp_path)
    res = run_cli(
        "audit", "--model", str(model), "--target", str(model), "--retain-model", str(model), "--data", "synthetic"
    )
    flat = "".join(c for c in res.stderr if not c.isspace() and c not in "│╭╮╰╯─")  # typer boxes usage errors
    assert res.returncode == 2 and needle.replace(" ", "") in flat and f"model/{UNLEARN_REPORT}" in flat, res.stderr
    assert "Traceback" not in res.stderr and digest_tree(tmp_path) == before and listing(tmp_path) == {"model"}


@pytest.mark.parametrize("command", [["voxceleb2", "speaker"], ["tofu", "run", "--method", "grad_ascent"]])
def test_a_recipe_out_that_is_a_user_folder_is_refused(tmp_path, command):
    from tests.reliability.untrusted import run_cli_here as run_cli

    out = tmp_path / "mine"
    out.mkdir()
    (out / "speaker.md").write_text("my notes")
    before = digest_tree(tmp_path)
    res = run_cli(
        *command, "--out", str(out), "--workdir" if command[0] == "voxceleb2" else "--cache-dir", str(tmp_path / "work")
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and str(out) in lines[0] and MARKER in lines[0], res.stderr
    assert digest_tree(tmp_path) == before and listing(tmp_path) == {"mine"}


def test_a_recipe_out_that_is_new_empty_or_ours_is_taken_and_marked(tmp_path):
    from recipes.recipe_cli import check_out, mark_out

    for out in (tmp_path / "new", tmp_path / "empty", tmp_path / "earlier"):
        check_out(out)
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "compare.json").write_text("{}")  # a recipe's results from before the marker
    check_out(tmp_path / "earlier")
    mark_out(tmp_path / "earlier")
    (tmp_path / "earlier" / "notes.txt").write_text("x")
    check_out(tmp_path / "earlier")  # marked: ours, whatever else it holds
    with pytest.raises(Exception, match="not a folder"):
        check_out(tmp_path / "earlier" / "notes.txt")
