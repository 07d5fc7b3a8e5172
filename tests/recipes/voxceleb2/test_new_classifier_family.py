"""A speaker-classifier family added from outside the repository costs one adapter module and one config file: a
module that registers a kind (detection, loading, a trainer naming :data:`mmunlearn.kinds.TRAINER_API`) and a YAML
config naming it run ``voxceleb2 speaker`` end to end (its original and retrained models built by its trainer, the
methods through the harness, the tables), with no file of the toolkit changed. The family here is a HuBERT
sequence classifier marked by its config, so it is told apart from the built-in hf-audio kind."""

import importlib
import json
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from mmunlearn import kinds
from mmunlearn.kinds import TRAINER_API, kind_of
from recipes.voxceleb2.cli import app
from recipes.voxceleb2.settings import models
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)

MODULE = "toy_hubert_family"
#: The whole new family: what a user's package would ship (and name in its ``mmunlearn.kinds`` entry point).
ADAPTER_MODULE = textwrap.dedent('''
    """A HuBERT speaker classifier family: detection by a mark in config.json, loading, and its trainer."""
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter
    from mmunlearn.data.utterances import UtteranceDataset
    from mmunlearn.kinds import Kind, read_small_json, register_kind
    from mmunlearn.train import TrainConfig, train as train_loop

    MARK = "toy_hubert_family"


    def detect(folder):
        config = read_small_json(folder / "config.json")
        return bool(config and config.get(MARK))


    def load(folder, *, device="auto", scope="all", **_):
        adapter = HFAudioAdapter.load(folder, device=device)
        adapter.scope = scope
        return adapter


    def train_config(preset, *, epochs=None, lr=None):
        return TrainConfig(epochs=epochs or 6, batch_size=8, lr=lr or 3e-3, schedule="onecycle")


    def describe(preset):
        return {"architecture": "HubertForSequenceClassification", "size": preset}


    def train(rows, *, speakers, preset="tiny", crop_seconds=1.0, config=None, seed=0, device="auto",
              progress=True, desc="train"):
        from transformers import HubertConfig, Wav2Vec2FeatureExtractor

        cfg = HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           conv_dim=(16, 16, 16), conv_kernel=(10, 8, 4), conv_stride=(10, 4, 4),
                           feat_extract_norm="layer", do_stable_layer_norm=True, num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=4, classifier_proj_size=16, mask_time_prob=0.0,
                           hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                           final_dropout=0.0, layerdrop=0.0)
        setattr(cfg, MARK, True)
        extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                             do_normalize=True, return_attention_mask=True)
        adapter = HFAudioAdapter.build(cfg, list(speakers), extractor, seed=seed, device=device)
        data = UtteranceDataset(list(rows), crop_seconds=crop_seconds, seed=seed, cache=adapter.audio_cache,
                                sr=adapter.sample_rate)
        result = train_loop(adapter.model, lambda m, b: adapter.loss(b, model=m), data, adapter.collate,
                            (config or train_config(preset)).replace(seed=seed), device=device, progress=progress,
                            desc=desc)
        adapter.model.eval()
        return adapter, result


    KIND = register_kind(Kind(
        "toy-hubert", detect=detect, load=load, adapter=HFAudioAdapter, sizes=("tiny",), default_size="tiny",
        description="a HuBERT speaker classifier (test family)", presets_from="speaker", train_in_eval_mode=True,
        is_classifier=True, takes_audio=True, priority=5, trainer=__name__))
''')


@pytest.fixture
def new_family(tmp_path, monkeypatch):
    """The family's module on the path and its kind registered, both undone afterwards."""
    kinds.kinds()  # the built-in kinds loaded into the registry that is restored below
    monkeypatch.setattr(kinds, "_REGISTRY", dict(kinds._REGISTRY))
    (tmp_path / f"{MODULE}.py").write_text(ADAPTER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(MODULE).KIND
    sys.modules.pop(MODULE, None)


def test_a_family_from_one_module_and_one_config_runs_the_speaker_benchmark(
    new_family,
    speaker_manifests,  # noqa: F811
    tmp_path,
):
    kind = new_family
    assert "toy-hubert" in models() and all(callable(getattr(kind.trainer_module(), n)) for n in TRAINER_API)
    config = tmp_path / "toy_hubert.yaml"
    config.write_text(
        f"# voxceleb2 speaker: the HuBERT family\nmodel: toy-hubert\npreset: tiny\n"
        f"manifests: {speaker_manifests}\nworkdir: {tmp_path / 'work'}\n"
        "methods: [qr-erase, grad_diff]\nsweep: false\nepochs: 1\ndevice: cpu\nthreads: 1\n"
    )
    res = CliRunner().invoke(app, ["speaker", "--config", str(config)])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    out = tmp_path / "work" / "toy-hubert" / "speaker"
    table = json.loads((out / "speaker.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["original model", "retrained model", "qr-erase", "grad_diff"]
    assert table["context"]["model"] == {
        "model": "toy-hubert",
        "architecture": "HubertForSequenceClassification",
        "size": "tiny",
    }
    original, retrained = table["context"]["original"], table["context"]["retrained"]
    assert kind_of(original) is kind_of(retrained) is kind  # built by the family's trainer, detected as its kind
    assert json.loads(open(f"{original}/config.json").read())["architectures"] == ["HubertForSequenceClassification"]
    for method in ("qr-erase", "grad_diff"):
        folder = out / method / "model"
        assert kind_of(folder) is kind
        assert json.loads((folder / "unlearn_report.json").read_text())["model_kind"] == "toy-hubert"
    assert table["rows"][0]["forget_acc"] > table["rows"][1]["forget_acc"]  # the original knew the forget speaker


def test_a_kind_without_a_trainer_is_no_model_of_the_benchmark(new_family, monkeypatch):
    import dataclasses

    monkeypatch.setitem(kinds._REGISTRY, "toy-hubert", dataclasses.replace(new_family, trainer=None))
    assert "toy-hubert" not in models()
    with pytest.raises(ValueError, match="names no trainer"):
        kinds.get_kind("toy-hubert").trainer_module()
