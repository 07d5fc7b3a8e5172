"""The mmunlearn CLI: erase and restore on checkpoint directories (single and sharded)."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mmunlearn.cli import app
from mmunlearn.taskvec import save_task_matrices
from tests.tiny import block_task_matrices, tiny_llama

runner = CliRunner()


def tree_digest(root: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file()}


def weights(root: Path) -> dict:
    out = {}
    for f in sorted(root.glob("*.safetensors")):
        if f.name != "undo_patch.safetensors":
            out.update(load_file(str(f)))
    return out


@pytest.fixture(params=["single", "sharded"])
def checkpoint(request, tmp_path):
    model = tiny_llama()
    src = tmp_path / "model"
    model.save_pretrained(src, max_shard_size="20KB" if request.param == "sharded" else "1GB")
    if request.param == "sharded":
        assert (src / "model.safetensors.index.json").is_file()
    tf = save_task_matrices(
        tmp_path / "forget.safetensors", block_task_matrices(model, hot=2, seed=1), {"kind": "test"}
    )
    tr = save_task_matrices(tmp_path / "retain.safetensors", block_task_matrices(model, hot=0, seed=2))
    return src, tf, tr


def test_help_lists_commands():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in ("version", "erase", "restore", "bench"):
        assert cmd in res.output
    assert "mmunlearn" in runner.invoke(app, ["version"]).output


def test_erase_writes_new_model_and_restore_is_bitwise(checkpoint, tmp_path):
    src, tf, tr = checkpoint
    before_files = tree_digest(src)
    out = tmp_path / "erased"
    res = runner.invoke(
        app, ["erase", "--model", str(src), "--forget", str(tf), "--retain", str(tr), "--out", str(out), "--rank", "3"]
    )
    assert res.exit_code == 0, res.output
    assert tree_digest(src) == before_files  # input checkpoint untouched
    for name in ("config.json", "erase_report.json", "layer_energy.png"):
        assert (out / name).is_file()
    # the undo patch (the original weights) is kept apart, beside the output, never inside it
    assert (tmp_path / "erased.undo" / "undo_patch.safetensors").is_file()
    assert not (out / "undo_patch.safetensors").exists()
    assert "erased.undo/undo_patch.safetensors" in "".join(res.output.split())  # says where it went (rich wraps)
    report = json.loads((out / "erase_report.json").read_text())
    assert report["undo"]["folder"] == "erased.undo"
    assert report["patch"] == str((tmp_path / "erased.undo" / "undo_patch.safetensors").resolve())
    assert report["selected"] == ["model.layers.2"]
    orig, new = weights(src), weights(out)
    assert orig.keys() == new.keys()
    changed = {k for k in orig if not torch.equal(orig[k], new[k])}
    assert changed and all(".layers.2." in k for k in changed)
    # the edited directory loads as a model
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)
    back = tmp_path / "restored"
    res = runner.invoke(app, ["restore", "--model", str(out), "--out", str(back)])
    assert res.exit_code == 0, res.output
    restored = weights(back)
    assert all(torch.equal(orig[k], restored[k]) for k in orig)
    assert not (back / "undo_patch.safetensors").exists()


def test_erase_refuses_existing_output_and_bad_paths(checkpoint, tmp_path):
    src, tf, _ = checkpoint
    out = tmp_path / "exists"
    out.mkdir()
    res = runner.invoke(app, ["erase", "--model", str(src), "--forget", str(tf), "--out", str(out), "--rank", "2"])
    assert res.exit_code != 0 and "already exists" in str(res.exception)
    res = runner.invoke(
        app,
        ["erase", "--model", str(tmp_path / "nope"), "--forget", str(tf), "--out", str(tmp_path / "o"), "--rank", "2"],
    )
    assert res.exit_code != 0 and "not found" in str(res.exception)
    assert not (tmp_path / "o").exists()


def test_failed_erase_leaves_no_output(checkpoint, tmp_path):
    src, _, _ = checkpoint
    bad = save_task_matrices(tmp_path / "bad.safetensors", {"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)})
    out = tmp_path / "o"
    res = runner.invoke(app, ["erase", "--model", str(src), "--forget", str(bad), "--out", str(out), "--rank", "1"])
    assert res.exit_code != 0 and "shape" in str(res.exception)
    assert not out.exists() and not any(p.name.startswith(".o.") for p in tmp_path.iterdir())
