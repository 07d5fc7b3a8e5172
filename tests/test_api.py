"""Tests of the voice-pipeline API ``mmunlearn.api.unlearn`` on a tiny speaker classifier and a tiny speech LLM."""

import hashlib

import pytest
import torch

from mmunlearn.api import REPORT_NAME, model_kind, unlearn
from mmunlearn.baselines import BaselineConfig
from mmunlearn.erase import PATCH_NAME, restore
from mmunlearn.speech.dataset import split_rows
from mmunlearn.taskvec.extract import ExtractConfig
from mmunlearn.methods.erase_method import EraseMethodConfig
from mmunlearn.methods.registry import MethodSettings
from tests.speech.corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)

FAST = MethodSettings(erase=EraseMethodConfig(rank=2, retain_rank=4, extract=ExtractConfig(kind="gradient", lr=1.0)),
                      baseline=BaselineConfig(epochs=1, lr=1e-3, batch_size=8), progress=False,
                      t3={"rank": 4, "epochs": 30, "lr": 5e-2, "temperature": 1.0})


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _changed(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


@pytest.fixture(scope="module")
def speaker_dir(speaker_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker import SpeakerAdapter

    speakers = sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")})
    path = tmp_path_factory.mktemp("api") / "speaker"
    SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=0).save(path)
    return path


def test_speaker_classifier_is_unlearned_into_the_same_format(speaker_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speaker import SpeakerAdapter

    import mmunlearn

    assert mmunlearn.unlearn is unlearn  # the package-level entry point is the API function
    with pytest.raises(AttributeError):
        mmunlearn.not_a_thing  # noqa: B018
    before = _digest(speaker_dir)
    result = mmunlearn.unlearn(speaker_dir, forget=speaker_manifests / "spk_forget_train.csv",
                               retain=speaker_manifests / "spk_retain_train.csv", method="qr-erase",
                               out=tmp_path / "out", settings=FAST, device="cpu")
    assert _digest(speaker_dir) == before  # the input is never modified
    assert model_kind(speaker_dir) == model_kind(tmp_path / "out") == "speaker"
    original, edited = SpeakerAdapter.load(speaker_dir, device="cpu"), SpeakerAdapter.load(tmp_path / "out", device="cpu")
    assert edited.speakers == original.speakers
    a, b = original.model.state_dict(), edited.model.state_dict()
    changed = _changed(a, b)
    selected = set(result.report["info"]["selected_layers"])
    groups = original.groups()
    assert changed and {groups[n] for n in changed} <= selected
    report = (tmp_path / "out" / REPORT_NAME).read_text()
    assert '"method": "qr-erase"' in report and result.report["forget_items"] == len(
        split_rows(speaker_manifests, "spk_forget_train"))
    restore(edited.model, tmp_path / "out" / PATCH_NAME)  # the undo patch gives the input back bit for bit
    assert not _changed(a, edited.model.state_dict())


def test_audio_label_pairs_and_errors(speaker_dir, llm_dir, speaker_manifests, tmp_path):
    forget = [(r["wav"], r["spk_id"]) for r in split_rows(speaker_manifests, "spk_forget_train")]
    retain = [(r["wav"], r["spk_id"]) for r in split_rows(speaker_manifests, "spk_retain_train")]
    result = unlearn(speaker_dir, forget=forget, retain=retain, method="grad_ascent", out=None, settings=FAST,
                     device="cpu")
    assert result.out is None and result.report["changed_fraction"] > 0 and result.report["forget_items"] == len(forget)
    with pytest.raises(ValueError, match="t3"):
        unlearn(speaker_dir, forget=forget, retain=retain, method="t3", device="cpu")
    with pytest.raises(ValueError, match="unknown method"):
        unlearn(speaker_dir, forget=forget, retain=retain, method="retrain")
    with pytest.raises(FileExistsError):
        unlearn(speaker_dir, forget=forget, retain=retain, out=llm_dir)
    (tmp_path / "junk").mkdir()
    with pytest.raises(ValueError, match="neither"):
        unlearn(tmp_path / "junk", forget=forget, retain=retain)
    with pytest.raises(ValueError, match="pair"):
        unlearn(speaker_dir, forget=["a.wav"], retain=retain)


def test_speech_llm_is_unlearned_into_the_same_format(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm import SpeechLLMAdapter

    before = _digest(llm_dir)
    result = unlearn(llm_dir, forget=speaker_manifests / "spk_forget_train.csv",
                     retain=speaker_manifests / "spk_retain_train.csv", method="qr-erase", out=tmp_path / "out",
                     retain_tasks=("speaker", "gender"), settings=FAST, device="cpu")
    assert _digest(llm_dir) == before
    out = tmp_path / "out"
    assert {"config.json", "tokenizer_config.json", "preprocessor_config.json", REPORT_NAME, PATCH_NAME,
            "layer_energy.png"} <= {p.name for p in out.iterdir()}
    original, edited = SpeechLLMAdapter.load(llm_dir, device="cpu"), SpeechLLMAdapter.load(out, device="cpu")
    assert edited.family is original.family and edited.chat_template == original.chat_template
    changed = _changed(original.model.state_dict(), edited.model.state_dict())
    groups = original.groups()
    assert changed and {groups[n] for n in changed} <= set(result.report["info"]["selected_layers"])
    assert result.report["retain_items"] == 2 * len(split_rows(speaker_manifests, "spk_retain_train"))
    restore(edited.model, out / PATCH_NAME)
    assert not _changed(original.model.state_dict(), edited.model.state_dict())


def test_speech_llm_where_audio_and_t3(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm import SpeechLLMAdapter

    forget, retain = speaker_manifests / "spk_forget_train.csv", speaker_manifests / "spk_retain_train.csv"
    audio = unlearn(llm_dir, forget=forget, retain=retain, method="svd-unlearn", out=tmp_path / "audio",
                    where="audio", settings=FAST, device="cpu")
    original = SpeechLLMAdapter.load(llm_dir, device="cpu").model.state_dict()
    changed = _changed(original, SpeechLLMAdapter.load(tmp_path / "audio", device="cpu").model.state_dict())
    assert changed and all("audio_tower" in n for n in changed)
    assert all(layer.startswith("audio.") for layer in audio.report["info"]["selected_layers"])
    tilted = unlearn(llm_dir, forget=forget, retain=retain, method="t3", out=tmp_path / "t3", settings=FAST,
                     device="cpu")
    assert (tmp_path / "t3" / "tilt" / "tilt_config.json").is_file()
    assert not _changed(original, SpeechLLMAdapter.load(tmp_path / "t3", device="cpu").model.state_dict())
    nll = tilted.report["forget_nll"]
    assert nll["after"] > nll["before"]
    tilted.adapter.model.tap.remove()
