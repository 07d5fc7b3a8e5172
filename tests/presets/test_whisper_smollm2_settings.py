"""The whisper-smollm2 preset's training settings: which clips train it (the original or the retrained reference)
and when a trained folder counts as done."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from mmunlearn.data.utterances import split_rows
from mmunlearn.presets.whisper_smollm2 import PresetTraining, _same_settings, clips
from tests.speech_corpus import llm_dir, speaker_manifests  # noqa: F401 (fixtures)


def test_the_retrained_reference_never_hears_a_forgotten_speaker(speaker_manifests):
    forgotten = {r["spk_id"] for r in split_rows(speaker_manifests, "spk_forget_train")}
    original = clips(speaker_manifests, PresetTraining().train_splits)
    retrained = clips(speaker_manifests, PresetTraining(train_splits=("spk_retain_train",)).train_splits)
    assert forgotten and forgotten <= {r["spk_id"] for r in original}
    assert retrained and not forgotten & {r["spk_id"] for r in retrained}
    assert {r["ID"] for r in retrained} < {r["ID"] for r in original}


def test_a_draw_is_balanced_over_speakers_and_seeded(speaker_manifests):
    rows = clips(speaker_manifests, ("train",), 8, seed=1)
    speakers = [r["spk_id"] for r in rows]
    assert len(rows) == 8 and max(map(speakers.count, set(speakers))) - min(map(speakers.count, set(speakers))) <= 1
    assert rows == clips(speaker_manifests, ("train",), 8, seed=1)
    assert [r["ID"] for r in rows] != [r["ID"] for r in clips(speaker_manifests, ("train",), 8, seed=2)]


def test_a_folder_trained_before_a_setting_existed_counts_at_its_default():
    now = json.loads(json.dumps(asdict(PresetTraining())))
    before = {k: v for k, v in now.items() if k != "train_splits"}
    assert _same_settings(before, now)
    assert not _same_settings(
        before, json.loads(json.dumps(asdict(PresetTraining(train_splits=("spk_retain_train",)))))
    )
    assert not _same_settings(None, now)


def test_no_split_is_refused():
    with pytest.raises(ValueError, match="split"):
        PresetTraining(train_splits=())


def test_an_evaluation_is_reused_only_for_the_same_model_settings_and_clips(tmp_path):
    from mmunlearn.presets.whisper_smollm2 import _earlier_result

    settings = json.loads(json.dumps(asdict(PresetTraining())))
    path = tmp_path / "results.json"
    assert _earlier_result(path, {"final_loss": 0.5}, settings, 10) is None  # nothing yet
    path.write_text(json.dumps({"trained": 0.5, "settings": settings, "context": {"test_clips": 10}, "rows": [1]}))
    assert _earlier_result(path, {"final_loss": 0.5}, settings, 10)["rows"] == [1]
    assert _earlier_result(path, {"final_loss": 0.4}, settings, 10) is None  # another model
    assert _earlier_result(path, {"final_loss": 0.5}, {**settings, "lr": 1.0}, 10) is None
    assert _earlier_result(path, {"final_loss": 0.5}, settings, 11) is None


def test_the_untrained_base_is_kept_once_per_assembly(llm_dir, tmp_path):
    import shutil

    import torch

    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from mmunlearn.presets.whisper_smollm2 import STAMP, _keep_base

    source = Path(shutil.copytree(llm_dir, tmp_path / "assembly"))
    (source / STAMP).write_text('{"version": 1}')
    adapter = SpeechLLMAdapter.load(source, device="cpu")
    _keep_base(adapter, source, tmp_path / "run" / "base")
    base = tmp_path / "run" / "base"
    kept = SpeechLLMAdapter.load(base, device="cpu").model.state_dict()
    assert all(torch.equal(v, kept[k]) for k, v in adapter.model.state_dict().items())
    written = (base / STAMP).stat().st_mtime_ns
    _keep_base(adapter, source, base)
    assert (base / STAMP).stat().st_mtime_ns == written  # same assembly: not rewritten
    (source / STAMP).write_text('{"version": 2}')
    _keep_base(adapter, source, base)
    assert (base / STAMP).read_text() == '{"version": 2}'
