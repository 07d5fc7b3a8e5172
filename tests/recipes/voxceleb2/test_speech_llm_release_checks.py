"""examples/speech_llm_release_checks.py on a tiny Whisper + Llama speech LLM (Qwen2-Audio architecture): a method's
output folder loaded by plain transformers, its edit located by tower, its undo patch restoring bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from examples import speech_llm_release_checks as checks
from mmunlearn.adapters.speech_llm.assemble import assemble
from recipes.voxceleb2 import speech_llm
from tests.adapters.test_speech_llm_assemble import _parts
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import FAST_OPTIONS


def test_edited_blocks_names_what_changed_and_refuses_other_tensors():
    original = {
        "model.audio_tower.layers.1.fc1.weight": torch.zeros(2),
        "model.language_model.layers.0.x": torch.ones(2),
    }
    assert checks.edited_blocks(original, dict(original)) == {}
    edited = {**original, "model.audio_tower.layers.1.fc1.weight": torch.tensor([0.0, 1e-8])}
    assert checks.edited_blocks(original, edited) == {"audio.layers.1": 1}
    signed = {
        **original,
        "model.language_model.layers.0.x": torch.tensor([1.0, 1.0]),
        "model.audio_tower.layers.1.fc1.weight": torch.tensor([-0.0, 0.0]),
    }
    assert checks.edited_blocks(original, signed) == {"audio.layers.1": 1}  # -0.0 is not 0.0 bit for bit
    with pytest.raises(ValueError, match="differ"):
        checks.edited_blocks(original, {"other": torch.zeros(2)})


def test_a_runs_outputs_load_in_transformers_and_restore_bit_for_bit(speaker_manifests, tmp_path):
    model = assemble(*_parts(), window_seconds=3, seed=0).save(tmp_path / "model")
    speech_llm.run(
        speaker_manifests,
        model,
        tmp_path / "run",
        level="speaker",
        methods=["qr-erase", "t3"],
        where="audio",
        options=FAST_OPTIONS,
        device="cpu",
        progress=False,
    )
    out = tmp_path / "checks.json"
    checks.main(
        [
            "--run",
            str(tmp_path / "run"),
            "--original",
            str(model),
            "--manifests",
            str(speaker_manifests),
            "--out",
            str(out),
        ]
    )
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"original", "qr-erase", "t3"}
    assert rows["t3"]["parameters_edited"] == 0 and rows["t3"]["restored_bit_for_bit"] is None  # a frozen base
    edit = rows["qr-erase"]
    assert edit["restored_bit_for_bit"] is True and edit["parameters_edited"] > 0
    assert edit["towers_touched"] == "audio" and all(b.startswith("audio.") for b in edit["edited_blocks"])
    assert all(
        isinstance(rows[m]["forgotten_answer"], str) and rows[m]["kept_speaker"] for m in ("original", "qr-erase")
    )
