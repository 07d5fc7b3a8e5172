"""The whisper-smollm2 preset's training settings: which clips train it (the original or the retrained reference)
and when a trained folder counts as done."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from mmunlearn.data.utterances import split_rows
from mmunlearn.presets.whisper_smollm2 import PresetTraining, _same_settings, clips
from tests.speech_corpus import speaker_manifests  # noqa: F401 (fixture)


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
    assert not _same_settings(before, json.loads(json.dumps(asdict(PresetTraining(train_splits=("spk_retain_train",))))))
    assert not _same_settings(None, now)


def test_no_split_is_refused():
    with pytest.raises(ValueError, match="split"):
        PresetTraining(train_splits=())
