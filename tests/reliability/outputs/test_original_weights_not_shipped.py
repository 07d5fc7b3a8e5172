"""Nothing that may hold the original weights reaches a folder mmunlearn writes, and ``check-release`` refuses a
folder that holds any: ``pytorch_model.bin`` beside the safetensors, ``original/consolidated.00.pth``, a
``.git/lfs/objects`` store, backups (``model.safetensors.orig``, ``model.orig.safetensors``, an extensionless copy),
an undo patch in a subfolder. ``check-release`` also refuses a T3 output (the unchanged weights under a decoding
filter) and a folder whose own report says the rule was missed, naming each reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmunlearn.adapters.speech_llm.io import _copy_side_files
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.unlearn import unlearn
from mmunlearn.cli import app
from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.files.held_weights import stray_weights, weight_bytes, weight_like
from mmunlearn.files.layout import UNLEARN_REPORT
from tests.reliability.untrusted import digest_tree, listing, make_checkpoint, make_forget
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer

runner = CliRunner()
SHARD = "model-00001-of-00003.safetensors"


def _plant(model: Path) -> set[str]:
    """Copies of the weights a downloaded folder often carries; the paths planted."""
    shard = (model / SHARD).read_bytes()
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04" + shard)
    (model / "original").mkdir()
    (model / "original" / "consolidated.00.pth").write_bytes(b"PK\x03\x04" + shard)
    lfs = model / ".git" / "lfs" / "objects" / "ab" / "cd"
    lfs.mkdir(parents=True)
    (lfs / ("abcd" * 16)).write_bytes(shard)
    (model / "model.safetensors.orig").write_bytes(shard)
    (model / "weights_backup").write_bytes(shard)  # no extension: found by its bytes
    (model / "README.md").write_text("the model's own side file")
    return {"pytorch_model.bin", "original/consolidated.00.pth", ".git/", "model.safetensors.orig", "weights_backup"}


def _release(folder: Path):
    return runner.invoke(app, ["check-release", "--model", str(folder)])


@pytest.mark.parametrize(
    "erase",
    [
        lambda m, f, o: stream_erase_checkpoint(m, f, o, rank=2, progress=False),
        lambda m, f, o: erase_checkpoint(m, f, o, rank=2),
    ],
    ids=["stream", "in-memory"],
)
def test_erase_leaves_other_weight_files_out_and_check_release_passes_it(tmp_path, erase):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    planted = _plant(model)
    assert (
        set(stray_weights(model, [SHARD, "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]))
        == planted
    )
    before = digest_tree(model)
    erase(model, forget, tmp_path / "out")
    written = {str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert not any(
        w.startswith(("pytorch_model", "original", ".git", "model.safetensors.orig", "weights_backup")) for w in written
    ), written
    assert (tmp_path / "out" / "README.md").read_text() == "the model's own side file"
    done = _release(tmp_path / "out")
    assert done.exit_code == 0 and "ready to release" in done.output, done.output
    assert digest_tree(model) == before and listing(tmp_path) == {"model", "forget.safetensors", "out", "out.undo"}


def test_check_release_names_every_file_that_may_hold_the_original_weights(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    out = tmp_path / "out"
    shutil.copy(out / SHARD, out / "model.orig.safetensors")
    (out / "backup").mkdir()
    shutil.copy(tmp_path / "out.undo" / "undo_patch.safetensors", out / "backup" / "undo_patch.safetensors")
    shutil.copytree(tmp_path / "out.undo", out / "records")  # a copied undo folder under another name
    planted = _plant(out)
    before = digest_tree(out)
    done = _release(out)
    assert done.exit_code == 1, done.output
    flagged = {
        line.split("NOT READY: ", 1)[1].split(":", 1)[0]
        for line in done.output.splitlines()
        if line.startswith("NOT READY: ")
    }
    assert flagged == planted | {
        "model.orig.safetensors",
        "backup/undo_patch.safetensors",
        "records/undo_patch.safetensors",
    }, done.output
    assert digest_tree(out) == before


def test_a_t3_output_is_never_ready_to_release(tmp_path, capsys):
    """A T3 output's base/ is the unchanged target (byte for byte): the run says it is not for release and
    check-release refuses it, saying why."""
    model = tmp_path / "model"
    TextLLMAdapter(tiny_causal_lm(layers=1, seed=2), tiny_tokenizer()).save(model)
    rows = [{"question": f"Who is person {i}?", "answer": f"Person {i} lives at {i} Elm Street."} for i in range(8)]
    unlearn(
        model,
        forget=rows[:2],
        retain=rows[2:],
        method="t3",
        out=tmp_path / "out",
        rule=None,
        device="cpu",
        size="micro",
        **fast("t3"),
    )
    assert "not for release" in capsys.readouterr().err
    out = tmp_path / "out"
    written = json.loads((out / UNLEARN_REPORT).read_text())
    assert list(written)[:2] == ["verdict", "release"]  # beside the verdict, the first thing a reader sees
    assert written["release"].startswith("not for release: a T3 output")
    assert (out / "base" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    before = digest_tree(out)
    done = _release(out)
    assert done.exit_code == 1 and "T3 output" in done.output and "decoding-time filter" in done.output, done.output
    assert "base/model.safetensors" not in done.output  # the base is named by the T3 reason, not as a stray file
    assert digest_tree(out) == before and listing(tmp_path) == {"model", "out"}


def test_a_folder_whose_report_says_the_rule_was_missed_is_not_ready(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    erase_checkpoint(model, make_forget(tmp_path / "forget.safetensors"), tmp_path / "out", rank=2)
    verdict = "RULE NOT MET by grad_diff: forget NLL 0.4 (target 2.0)"
    (tmp_path / "out" / UNLEARN_REPORT).write_text(
        json.dumps({"method": "grad_diff", "target_reached": False, "verdict": verdict})
    )
    done = _release(tmp_path / "out")
    assert done.exit_code == 1 and "the rule was missed" in done.output and verdict in done.output, done.output
    (tmp_path / "out" / UNLEARN_REPORT).write_text(
        json.dumps({"method": "grad_diff", "target_reached": True, "verdict": "rule met by grad_diff"})
    )
    assert _release(tmp_path / "out").exit_code == 0


def test_the_speech_llm_copier_leaves_weight_side_files_out(tmp_path):
    source, out = tmp_path / "speech", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    weights = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a":{"dtype":"F32"}}'
    for name in ("consolidated.pth", "model.safetensors.orig", "weights.copy"):
        (source / name).write_bytes(weights)
    (source / "spk_dict.pt").write_bytes(b"voice table")
    (source / "README.md").write_text("card")
    before = digest_tree(source)
    _copy_side_files(source, out)
    assert listing(out) == {"spk_dict.pt", "README.md"}
    assert digest_tree(source) == before


def test_the_notion_of_what_holds_weights():
    for held in (
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        ".git/lfs/objects/ab/cd/x",
        "m.safetensors.orig",
        "model.orig.safetensors",
        "x.undo/undo.json",
        "undo_history/request-0001.json",
        "flax_model.msgpack",
    ):
        assert weight_like(held), held
    for side in (
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "README.md",
        "spk_dict.pt",
        "tokenizer.model",
        "preprocessor_config.json",
    ):
        assert not weight_like(side), side
    assert weight_bytes(b"\x80\x04\x95") and weight_bytes(b"GGUF\x03") and not weight_bytes(b'{"model_type": "x"}')
