"""``mmunlearn erase`` keeps its undo patch apart, in ``<out>.undo/`` beside the output (as the harness does): the
output holds no original weights (``check-release`` passes), its ``erase_report.json`` names the undo folder, and
``mmunlearn restore`` (or the library's restores, with no patch given) finds it there and gives the input back bit for
bit, also after the pair was moved together; an older output that still holds its patch inside keeps working."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mmunlearn.cli import app
from mmunlearn.erase.in_memory import erase_checkpoint, restore_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint, stream_restore_checkpoint
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.layout import ERASE_REPORT, PATCH_NAME
from mmunlearn.files.undo_store import UNDO_INFO, release_problems, undo_dir_of
from tests.reliability.untrusted import make_checkpoint, make_forget

runner = CliRunner()


def weights(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's weight files (no undo patch can be among them)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        assert f.name != PATCH_NAME
        out.update(load_file(str(f)))
    return out


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


@pytest.fixture
def inputs(tmp_path):
    return make_checkpoint(tmp_path / "model"), make_forget(tmp_path / "forget.safetensors")


def erase_cli(model: Path, forget: Path, out: Path, *flags: str) -> None:
    res = runner.invoke(
        app, ["erase", "--model", str(model), "--forget", str(forget), "--out", str(out), "--rank", "2", *flags]
    )
    assert res.exit_code == 0, res.output


def restore_cli(model: Path, out: Path) -> None:
    res = runner.invoke(app, ["restore", "--model", str(model), "--out", str(out)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("flag", ["--stream", "--no-stream"])
def test_erase_output_holds_no_patch_passes_check_release_and_restores_bitwise(inputs, tmp_path, flag):
    model, forget = inputs
    out = tmp_path / "out"
    erase_cli(model, forget, out, flag)
    assert not (out / PATCH_NAME).exists()  # the released folder holds no original weights
    undo = tmp_path / "out.undo"
    assert (undo / PATCH_NAME).is_file() and (undo / UNDO_INFO).is_file()
    assert undo.stat().st_mode & 0o777 == 0o700  # readable by its owner only
    report = json.loads((out / ERASE_REPORT).read_text())
    assert report["undo"]["folder"] == "out.undo"
    assert report["undo"]["id"] == json.loads((undo / UNDO_INFO).read_text())["id"]
    assert report["patch"] == str((undo / PATCH_NAME).resolve())
    assert undo_dir_of(out) == undo
    assert release_problems(out) == []
    res = runner.invoke(app, ["check-release", "--model", str(out)])
    assert res.exit_code == 0 and "ready to release" in res.output, res.output
    assert not bitwise_equal(weights(model), weights(out))  # it did edit
    restore_cli(out, tmp_path / "restored")
    assert bitwise_equal(weights(model), weights(tmp_path / "restored"))
    assert not (tmp_path / "restored" / PATCH_NAME).exists() and not (tmp_path / "restored" / ERASE_REPORT).exists()
    assert not (tmp_path / "restored.undo").exists()


@pytest.mark.parametrize("erase", [erase_checkpoint, stream_erase_checkpoint])
def test_library_restores_find_the_patch_apart(inputs, tmp_path, erase):
    model, forget = inputs
    out = tmp_path / "out"
    report = erase(model, forget, out, rank=2)
    assert report.undo["folder"] == "out.undo"
    assert Path(report.patch_path) == (tmp_path / "out.undo" / PATCH_NAME).resolve()
    assert not (out / PATCH_NAME).exists() and Path(report.patch_path).is_file()
    restore_checkpoint(out, tmp_path / "mem")  # no patch given: the one the report names
    stream_restore_checkpoint(out, tmp_path / "str", progress=False)
    assert bitwise_equal(weights(model), weights(tmp_path / "mem"))
    assert bitwise_equal(weights(model), weights(tmp_path / "str"))


def test_a_moved_pair_still_restores(inputs, tmp_path):
    model, forget = inputs
    erase_cli(model, forget, tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(tmp_path / "out", elsewhere / "out")
    os.replace(tmp_path / "out.undo", elsewhere / "out.undo")
    assert undo_dir_of(elsewhere / "out") == elsewhere / "out.undo"
    restore_cli(elsewhere / "out", tmp_path / "restored")
    assert bitwise_equal(weights(model), weights(tmp_path / "restored"))


def test_an_output_moved_without_its_undo_folder_or_given_another_is_an_error(inputs, tmp_path):
    model, forget = inputs
    erase_cli(model, forget, tmp_path / "a")
    erase_cli(model, forget, tmp_path / "b")
    shutil.rmtree(tmp_path / "b.undo")
    with pytest.raises(FileNotFoundError, match="kept apart"):
        restore_checkpoint(tmp_path / "b", tmp_path / "r")
    os.replace(tmp_path / "a.undo", tmp_path / "b.undo")  # another output's undo folder: its id does not match
    with pytest.raises(UnsafePathError, match="is not the undo folder of"):
        stream_restore_checkpoint(tmp_path / "b", tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def test_overwrite_replaces_the_undo_folder_too_and_without_it_nothing_is_written(inputs, tmp_path):
    model, forget = inputs
    out = tmp_path / "out"
    first = erase_checkpoint(model, forget, out, rank=2)
    (tmp_path / "out.undo" / "stale.txt").write_text("from the first run")
    os.chmod(tmp_path / "out.undo", 0o700)
    second = stream_erase_checkpoint(model, forget, out, rank=1, overwrite=True, progress=False)
    assert second.undo["id"] != first.undo["id"] and not (tmp_path / "out.undo" / "stale.txt").exists()
    restore_cli(out, tmp_path / "restored")
    assert bitwise_equal(weights(model), weights(tmp_path / "restored"))
    shutil.rmtree(out)  # the undo folder is left: a new erase into out refuses it before any work
    with pytest.raises(FileExistsError, match="out.undo"):
        erase_checkpoint(model, forget, out, rank=2)
    assert not out.exists()


def test_an_older_output_holding_its_patch_inside_still_restores(inputs, tmp_path):
    model, forget = inputs
    out = tmp_path / "out"
    erase_checkpoint(model, forget, out, rank=2)
    os.replace(tmp_path / "out.undo" / PATCH_NAME, out / PATCH_NAME)  # the layout of earlier versions
    report = json.loads((out / ERASE_REPORT).read_text())
    del report["undo"]
    (out / ERASE_REPORT).write_text(json.dumps(report))
    shutil.rmtree(tmp_path / "out.undo")
    assert undo_dir_of(out) == out and release_problems(out)  # check-release flags it
    restore_cli(out, tmp_path / "restored")
    assert bitwise_equal(weights(model), weights(tmp_path / "restored"))
