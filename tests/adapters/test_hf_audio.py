"""The Hugging Face audio-classifier kind (``hf-audio``) end to end: a tiny wav2vec2 classifier built from a config and
trained a few steps on the synthetic speakers, unlearned through ``mmunlearn.unlearn``, restored bit for bit, and
its output folder run by ``transformers.pipeline("audio-classification")`` unchanged."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter, block_of
from mmunlearn.api.restore import restore_folder
from mmunlearn.api.unlearn import load_model, model_kind, unlearn
from mmunlearn.audit.folder import detect_kind
from mmunlearn.data.utterances import split_rows
from mmunlearn.eval.speaker import score_rows
from mmunlearn.kinds import get_kind, kind_of
from mmunlearn.methods import get, names
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)


def tiny_wav2vec2_config():
    """A 2-layer, 32-wide wav2vec2 classifier config (three small convolutions, no dropout or masking)."""
    from transformers import Wav2Vec2Config

    return Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_kernel=(10, 5, 4),
        conv_stride=(10, 5, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        classifier_proj_size=16,
        mask_time_prob=0.0,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
    )


@pytest.fixture(scope="module")
def hf_dir(speaker_manifests, tmp_path_factory):
    """A tiny wav2vec2 speaker classifier trained 40 steps on the corpus, saved with save_pretrained."""
    from transformers import Wav2Vec2FeatureExtractor

    from mmunlearn.train.config import TrainConfig
    from mmunlearn.train.loop import train

    rows = split_rows(speaker_manifests, "train")
    fe = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=False
    )
    adapter = HFAudioAdapter.build(tiny_wav2vec2_config(), sorted({r["spk_id"] for r in rows}), fe, device="cpu")
    train(
        adapter.model,
        lambda m, b: adapter.loss(b, model=m),
        rows,
        adapter.collate,
        TrainConfig(steps=40, lr=3e-3, batch_size=8, seed=0),
        progress=False,
        device="cpu",
    )
    adapter.model.eval()
    path = tmp_path_factory.mktemp("hf_audio") / "wav2vec2"
    adapter.save(path)
    return path


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def _same_bits(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_kind_is_detected_loaded_and_takes_the_speaker_presets(hf_dir, speaker_manifests):
    assert kind_of(hf_dir).name == model_kind(hf_dir) == detect_kind(hf_dir) == "hf-audio"
    kind = get_kind("hf-audio")
    assert kind.is_classifier and kind.takes_audio and kind.train_in_eval_mode and not kind.has_batchnorm
    assert kind.weight_files == ()  # safetensors: restore needs nothing of its own
    assert "t3" not in names("hf-audio") and {"qr-erase", "grad_diff"} <= set(names("hf-audio"))
    assert get("qr-erase").config_for("hf-audio", "tiny") == get("qr-erase").config_for("speaker", "tiny")
    with pytest.raises(ValueError, match="t3 does not apply to a hf-audio model"):
        get("t3", "hf-audio")
    head = load_model(hf_dir, device="cpu", scope="head")  # the class rows alone, as for a SpeechBrain classifier
    assert [lw.name for lw in head.layers()] == [head.head_weight] == ["classifier.weight"]
    assert head.with_model(head.model).scope == "head"
    below = load_model(hf_dir, device="cpu", scope="embedding")
    assert head.head_weight not in {lw.name for lw in below.layers()} and len(list(below.layers())) > 1
    with pytest.raises(ValueError, match="scope must be one of"):
        load_model(hf_dir, device="cpu", scope="sweep")

    adapter = load_model(hf_dir, device="cpu")
    assert isinstance(adapter, HFAudioAdapter) and adapter.speakers == sorted(
        {r["spk_id"] for r in split_rows(speaker_manifests, "train")}
    )
    layers = list(adapter.layers())
    assert {lw.block for lw in layers} == {
        "feature_projection",
        "encoder.layers.0",
        "encoder.layers.1",
        "projector",
        "classifier",
    }
    assert all(lw.weight.dim() == 2 for lw in layers) and "classifier.weight" in adapter.groups()
    assert not any("conv" in lw.name for lw in layers)  # the convolutional feature encoder stays untouched
    assert block_of("hubert.encoder.layers.7.feed_forward.output_dense.weight") == "encoder.layers.7"

    rows = split_rows(speaker_manifests, "spk_retain_test")
    scores = score_rows(adapter, rows, batch_size=4, desc=None)
    assert scores.logits.shape == (len(rows), len(adapter.speakers)) and scores.embeddings.shape == (len(rows), 16)
    alone = adapter.logits(adapter.collate(rows[:1])).detach().numpy()[0]
    np.testing.assert_allclose(
        scores.logits[0 if len(rows) == 1 else list(scores.ids).index(rows[0]["ID"])], alone, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("method", ["qr-erase", "grad_diff"])
def test_unlearned_restored_bit_for_bit_and_run_by_the_transformers_pipeline(
    method, hf_dir, speaker_manifests, tmp_path
):
    from transformers import pipeline

    from mmunlearn.erase import PATCH_NAME

    forget = speaker_manifests / "spk_forget_train.csv"
    retain = speaker_manifests / "spk_retain_train.csv"
    settings = {"qr-erase": dict(size="tiny"), "grad_diff": dict(rule=None, epochs=2, lr=1e-3)}[method]
    result = unlearn(
        hf_dir,
        forget=forget,
        retain=retain,
        method=method,
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        **settings,
    )
    report = result.report
    assert (
        report["model_kind"] == "hf-audio"
        and report["where"] is None
        and (tmp_path / "out.undo" / PATCH_NAME).is_file()
    )
    assert not (tmp_path / "out" / PATCH_NAME).exists()  # the undo records are kept apart from the model
    if method == "qr-erase":  # the default scope: the class rows first, as for a SpeechBrain classifier
        assert list(report["scopes_tried"])[0] == "head" and report["scope"] in report["scopes_tried"]
    assert report["changed_fraction"] > 0 and report["forget_nll"]["after"] > report["forget_nll"]["before"]
    if method == "qr-erase":  # the classifier rule drove the sweep, as for a SpeechBrain classifier
        assert report["rule"]["forget_measure"] == "worst_speaker_error_rate" and report["info"]["sweep"]
    assert not _same_bits(_weights(tmp_path / "out"), _weights(hf_dir))

    restore_folder(tmp_path / "out", tmp_path / "restored", progress=False)
    assert _same_bits(_weights(tmp_path / "restored"), _weights(hf_dir))
    assert model_kind(tmp_path / "restored") == "hf-audio"

    classify = pipeline("audio-classification", model=str(tmp_path / "out"), device="cpu")
    wave = np.sin(2 * np.pi * 220 * np.arange(16000) / 16000).astype(np.float32)
    labels = classify({"raw": wave, "sampling_rate": 16000}, top_k=len(result.adapter.speakers))
    assert {x["label"] for x in labels} == set(result.adapter.speakers)
    assert abs(sum(x["score"] for x in labels) - 1.0) < 1e-4


def test_mmunlearn_audit_runs_on_a_hf_audio_folder_with_the_classifier_defaults(hf_dir, speaker_manifests, tmp_path):
    """The audit defaults are keyed by kind capability: hf-audio, a classifier with no entry of its own, takes the
    speaker classifiers' relearning budget; `mmunlearn audit` runs every attack on its unlearned folder."""
    import json

    from typer.testing import CliRunner

    from mmunlearn.audit.options import CAPABILITY_DEFAULTS, kind_defaults, options_for
    from mmunlearn.cli import app
    from mmunlearn.train.config import TrainConfig
    from mmunlearn.train.loop import train

    assert kind_defaults("hf-audio") == kind_defaults("speaker") == CAPABILITY_DEFAULTS["is_classifier"]
    assert options_for("hf-audio") == options_for("speaker") != options_for("text") == options_for("no-such-kind")
    retain_rows = split_rows(speaker_manifests, "spk_retain_train")
    target = HFAudioAdapter.load(hf_dir, device="cpu")
    retrained = HFAudioAdapter.build(
        tiny_wav2vec2_config(), target.speakers, target.feature_extractor, seed=1, device="cpu"
    )
    train(
        retrained.model,
        lambda m, b: retrained.loss(b, model=m),
        retain_rows,
        retrained.collate,
        TrainConfig(steps=20, lr=3e-3, batch_size=8, seed=0),
        progress=False,
        device="cpu",
    )
    retrained.model.eval()
    retrained.save(tmp_path / "retrained")
    unlearn(
        hf_dir,
        forget=speaker_manifests / "spk_forget_train.csv",
        retain=speaker_manifests / "spk_retain_train.csv",
        method="grad_ascent",
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        rule=None,
        epochs=1,
        lr=1e-3,
    )
    res = CliRunner().invoke(
        app,
        [
            "audit",
            "--model",
            str(tmp_path / "out"),
            "--target",
            str(hf_dir),
            "--retain-model",
            str(tmp_path / "retrained"),
            "--data",
            str(speaker_manifests),
            "--out",
            str(tmp_path / "audit"),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    (result,) = json.loads((tmp_path / "audit" / "AUDIT.json").read_text())["results"]
    assert result["model_kind"] == "hf-audio" and result["method"] == "grad_ascent" and result["level"] == "speaker"
    assert result["options"]["relearn_steps"] == CAPABILITY_DEFAULTS["is_classifier"]["relearn_steps"]
    assert result["options"]["relearn_lr"] == CAPABILITY_DEFAULTS["is_classifier"]["relearn_lr"]
    assert {"relearn", "quantise_8bit", "quantise_4bit"} <= set(result["attacks"])
    attacks = result["attacks"]
    for measured in (attacks["quantise_8bit"]["unlearned"], attacks["relearn"]["unlearned"]["after"]):
        assert 0.0 <= measured["forget_acc"] <= 1.0
    assert (tmp_path / "audit" / "AUDIT.md").read_text().count("grad_ascent") >= 1


def test_the_head_scope_reuses_pooled_vectors_only_while_the_weights_below_the_head_stay(hf_dir, speaker_manifests):
    """With the head scope a second scoring of the same clips runs only the head (cache hits) and scores as a full
    pass does; a head edit is scored from the kept vectors; an edit below the head is never served from them."""
    adapter = HFAudioAdapter.load(hf_dir, device="cpu")
    rows = split_rows(speaker_manifests, "train")[:12]
    batch = adapter.collate(rows)
    assert len(set(batch["lengths"].tolist())) > 1 and "attention_mask" not in batch  # the per-length path

    def full() -> tuple[torch.Tensor, torch.Tensor]:
        twin = adapter.with_model(adapter.model)
        twin.scope = "all"  # no cache
        return twin.logits_and_embeddings(batch)

    with torch.no_grad():
        plain = full()
        adapter.scope = "head"
        first, again = adapter.logits_and_embeddings(batch), adapter.logits_and_embeddings(batch)
        cache = adapter.embedding_cache
        assert (cache.misses, cache.hits) == (12, 12)
        for got, want in zip((*first, *again), (*plain, *plain)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        adapter.model.classifier.weight[0] += 1.0  # a head edit: the kept vectors, the new head
        edited, reference = adapter.logits_and_embeddings(batch), full()
        assert (cache.misses, cache.hits) == (12, 24)
        torch.testing.assert_close(edited[0], reference[0], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(edited[0], first[0])
        adapter.model.projector.weight.mul_(1.5)  # below the head: every vector computed again
        moved, reference = adapter.logits_and_embeddings(batch), full()
        assert (cache.misses, cache.hits) == (24, 24)
        torch.testing.assert_close(moved[1], reference[1], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(moved[1], first[1])
