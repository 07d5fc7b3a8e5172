"""Tests of the voice-pipeline API ``mmunlearn.unlearn`` (mmunlearn/api/unlearn.py) on a tiny speaker classifier
and a tiny speech LLM."""

import hashlib

import pytest
import torch

from mmunlearn.api.restore import restore_folder
from mmunlearn.api.rules import SPEAKER_FORGET_TARGET, chance_error_rate
from mmunlearn.api.unlearn import REPORT_NAME, model_kind, unlearn
from mmunlearn.data.utterances import split_rows
from mmunlearn.erase import PATCH_NAME, restore
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import fast


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _changed(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


@pytest.fixture(scope="module")
def speaker_dir(speaker_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    speakers = sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")})
    path = tmp_path_factory.mktemp("api") / "speaker"
    SpeakerAdapter.build(speakers, preset="tiny", device="cpu", seed=0).save(path)
    return path


def test_speaker_classifier_is_unlearned_into_the_same_format(speaker_dir, speaker_manifests, tmp_path):
    import mmunlearn
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    assert mmunlearn.unlearn is unlearn  # the package-level entry point is the API function
    with pytest.raises(AttributeError):
        mmunlearn.not_a_thing  # noqa: B018
    before = _digest(speaker_dir)
    result = mmunlearn.unlearn(
        speaker_dir,
        forget=speaker_manifests / "spk_forget_train.csv",
        retain=speaker_manifests / "spk_retain_train.csv",
        method="qr-erase",
        out=tmp_path / "out",
        device="cpu",
        progress=False,
        rule=None,
        **fast("qr-erase"),
    )
    assert _digest(speaker_dir) == before  # the input is never modified
    assert result.report["verdict"].startswith("NOT CHECKED") and result.report["target_reached"] is None
    assert model_kind(speaker_dir) == model_kind(tmp_path / "out") == "speaker"
    original, edited = (
        SpeakerAdapter.load(speaker_dir, device="cpu"),
        SpeakerAdapter.load(tmp_path / "out", device="cpu"),
    )
    assert edited.speakers == original.speakers
    a, b = original.model.state_dict(), edited.model.state_dict()
    changed = _changed(a, b)
    selected = set(result.report["info"]["selected_layers"])
    groups = original.groups()
    assert changed and {groups[n] for n in changed} <= selected
    report = (tmp_path / "out" / REPORT_NAME).read_text()
    assert '"method": "qr-erase"' in report and result.report["forget_items"] == len(
        split_rows(speaker_manifests, "spk_forget_train")
    )
    assert not (tmp_path / "out" / PATCH_NAME).exists()  # the released folder holds no original weights
    restore(edited.model, tmp_path / "out.undo" / PATCH_NAME)  # the undo patch gives the input back bit for bit
    assert not _changed(a, edited.model.state_dict())


def test_audio_label_pairs_and_errors(speaker_dir, llm_dir, speaker_manifests, tmp_path):
    forget = [(r["wav"], r["spk_id"]) for r in split_rows(speaker_manifests, "spk_forget_train")]
    retain = [(r["wav"], r["spk_id"]) for r in split_rows(speaker_manifests, "spk_retain_train")]
    result = unlearn(
        speaker_dir,
        forget=forget,
        retain=retain,
        method="grad_ascent",
        out=None,
        device="cpu",
        progress=False,
        rule=None,
        **fast("grad_ascent"),
    )
    assert result.out is None and result.report["changed_fraction"] > 0 and result.report["forget_items"] == len(forget)
    with pytest.raises(ValueError, match="t3 does not apply"):
        unlearn(speaker_dir, forget=forget, retain=retain, method="t3", device="cpu")
    with pytest.raises(ValueError, match="unknown method"):
        unlearn(speaker_dir, forget=forget, retain=retain, method="retrain")
    with pytest.raises(FileExistsError):
        unlearn(speaker_dir, forget=forget, retain=retain, out=llm_dir)
    (tmp_path / "junk").mkdir()
    with pytest.raises(ValueError, match="not a model folder mmunlearn reads"):
        unlearn(tmp_path / "junk", forget=forget, retain=retain)
    with pytest.raises(ValueError, match="pair"):
        unlearn(speaker_dir, forget=["a.wav"], retain=retain)


def test_speech_llm_is_unlearned_into_the_same_format(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    before = _digest(llm_dir)
    result = unlearn(
        llm_dir,
        forget=speaker_manifests / "spk_forget_train.csv",
        retain=speaker_manifests / "spk_retain_train.csv",
        method="qr-erase",
        out=tmp_path / "out",
        retain_tasks=("speaker", "gender"),
        device="cpu",
        progress=False,
        **fast("qr-erase"),
    )
    assert _digest(llm_dir) == before
    out = tmp_path / "out"
    assert {"config.json", "tokenizer_config.json", "preprocessor_config.json", REPORT_NAME, "layer_energy.png"} <= {
        p.name for p in out.iterdir()
    } and PATCH_NAME not in {p.name for p in out.iterdir()}
    assert (tmp_path / "out.undo" / PATCH_NAME).is_file()  # kept apart, beside it
    original, edited = SpeechLLMAdapter.load(llm_dir, device="cpu"), SpeechLLMAdapter.load(out, device="cpu")
    assert edited.family is original.family and edited.chat_template == original.chat_template
    changed = _changed(original.model.state_dict(), edited.model.state_dict())
    groups = original.groups()
    assert changed and {groups[n] for n in changed} <= set(result.report["info"]["selected_layers"])
    assert result.report["retain_items"] == 2 * len(split_rows(speaker_manifests, "spk_retain_train"))
    restore_folder(out, tmp_path / "restored")  # on disk: the patch names tensors as the saved files do
    restored = SpeechLLMAdapter.load(tmp_path / "restored", device="cpu")
    assert not _changed(original.model.state_dict(), restored.model.state_dict())


def test_speech_llm_where_audio_and_t3(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    forget, retain = speaker_manifests / "spk_forget_train.csv", speaker_manifests / "spk_retain_train.csv"
    audio = unlearn(
        llm_dir,
        forget=forget,
        retain=retain,
        method="svd-unlearn",
        out=tmp_path / "audio",
        where="audio",
        device="cpu",
        progress=False,
        **fast("svd-unlearn"),
    )
    original = SpeechLLMAdapter.load(llm_dir, device="cpu").model.state_dict()
    changed = _changed(original, SpeechLLMAdapter.load(tmp_path / "audio", device="cpu").model.state_dict())
    assert changed and all("audio_tower" in n for n in changed)
    assert all(layer.startswith("audio.") for layer in audio.report["info"]["selected_layers"])
    tilted = unlearn(
        llm_dir,
        forget=forget,
        retain=retain,
        method="t3",
        out=tmp_path / "t3",
        device="cpu",
        progress=False,
        **fast("t3"),
    )
    assert (tmp_path / "t3" / "tilt" / "tilt_config.json").is_file()
    assert not _changed(original, SpeechLLMAdapter.load(tmp_path / "t3" / "base", device="cpu").model.state_dict())
    nll = tilted.report["forget_nll"]
    assert nll["after"] > nll["before"]
    tilted.adapter.model.tap.remove()


def test_rmu_on_a_speech_llm_restores_from_its_folder(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    forget, retain = speaker_manifests / "spk_forget_train.csv", speaker_manifests / "spk_retain_train.csv"
    res = unlearn(
        llm_dir,
        forget=forget,
        retain=retain,
        method="rmu",
        out=tmp_path / "rmu",
        device="cpu",
        progress=False,
        layer=1,
        lr=1e-3,
        epochs=2,
        steering=8.0,
    )
    assert res.report["info"]["updated_layers"] == [0, 1]
    original = SpeechLLMAdapter.load(llm_dir, device="cpu").model.state_dict()
    changed = _changed(original, SpeechLLMAdapter.load(tmp_path / "rmu", device="cpu").model.state_dict())
    # only the language model's MLPs of layers 0..1 train (the random-init tiny model's NLL says little here;
    # tests/methods/test_methods.py checks that RMU raises the forget NLL of a trained model)
    assert changed and all(".language_model.layers." in n and ".mlp." in n for n in changed)
    restore_folder(tmp_path / "rmu", tmp_path / "back")
    assert not _changed(original, SpeechLLMAdapter.load(tmp_path / "back", device="cpu").model.state_dict())


def test_a_speaker_folder_that_names_code_is_refused_before_anything_runs(speaker_dir, speaker_manifests, tmp_path):
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(speaker_dir, evil)
    marker = tmp_path / "pwned"
    with (evil / "hyperparams.yaml").open("a") as fh:
        fh.write(f'\npwn: !apply:os.system ["touch {marker}"]\n')
    before = _digest(evil)
    with pytest.raises(ValueError, match="apply:os.system"):
        unlearn(
            evil,
            forget=speaker_manifests / "spk_forget_train.csv",
            retain=speaker_manifests / "spk_retain_train.csv",
            out=tmp_path / "out",
            device="cpu",
        )
    assert not marker.exists() and not (tmp_path / "out").exists() and _digest(evil) == before


def test_the_output_may_not_be_the_input_or_inside_it(speaker_dir, speaker_manifests, tmp_path):
    forget, retain = speaker_manifests / "spk_forget_train.csv", speaker_manifests / "spk_retain_train.csv"
    before = _digest(speaker_dir)
    for out in (speaker_dir, speaker_dir / "inside", speaker_dir.parent):
        with pytest.raises(ValueError):
            unlearn(speaker_dir, forget=forget, retain=retain, out=out, overwrite=True, device="cpu", progress=False)
    assert _digest(speaker_dir) == before and not (speaker_dir / "inside").exists()


def test_head_scope_edits_only_the_class_weights(speaker_dir, llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.methods import SweepRule, mean_nll

    forget = speaker_manifests / "spk_forget_train.csv"
    retain = speaker_manifests / "spk_retain_train.csv"
    rule = SweepRule(forget_target=1e9, retain_bound=0.5, retain_measure=mean_nll)  # a sweep that scores points
    result = unlearn(
        speaker_dir,
        forget=forget,
        retain=retain,
        method="qr-erase",
        out=tmp_path / "head",
        device="cpu",
        progress=False,
        scope="head",
        rule=rule,
        **{**fast("qr-erase"), "retain_rank": 0, "extract_kind": "gradient", "sweep_scales": "auto"},
    )
    original, edited = (
        SpeakerAdapter.load(speaker_dir, device="cpu"),
        SpeakerAdapter.load(tmp_path / "head", device="cpu"),
    )
    assert _changed(original.model.state_dict(), edited.model.state_dict()) == {"classifier.weight"}
    assert result.report["scope"] == "head" and result.adapter.embedding_cache.hits > 0  # the sweep reused embeddings
    with pytest.raises(ValueError, match="applies to classifiers"):
        unlearn(
            llm_dir,
            forget=forget,
            retain=retain,
            method="qr-erase",
            out=tmp_path / "llm",
            device="cpu",
            progress=False,
            scope="head",
        )


def test_rule_auto_sweeps_a_speaker_classifier_by_the_documented_rule(speaker_dir, speaker_manifests, tmp_path):
    from mmunlearn.api.unlearn import speaker_rule, swept_overrides

    forget, retain = (speaker_manifests / f"{n}.csv" for n in ("spk_forget_train", "spk_retain_train"))
    res = unlearn(
        speaker_dir,
        forget=forget,
        retain=retain,
        method="qr-erase",
        scope="head",
        out=None,
        device="cpu",
        progress=False,
        sweep_ranks=(1,),
    )  # no rule given: "auto" is the default
    rule = res.report["rule"]
    # the report's first field says whether the rule was met, with the numbers that decide it
    assert next(iter(res.report)) == "verdict" and res.report["verdict"].startswith(
        "rule met" if res.report["target_reached"] else "RULE NOT MET"
    )
    assert f"(target >= {rule['forget_target']:.4g}; higher = more forgotten)" in res.report["verdict"]
    assert (
        "forget set: share of the worst forgotten speaker's clips predicted as none of the forgotten speakers"
        in res.report["verdict"]
        and "retain set: mean NLL (nats) rose" in res.report["verdict"]
    )
    assert rule["forget_measure"] == "worst_speaker_error_rate" and rule["forget_target"] == SPEAKER_FORGET_TARGET
    assert res.report["knowledge_check"]["chance"] == pytest.approx(
        1 - 1 / 4
    )  # "nothing to forget" is judged at chance
    assert rule["retain_bound"] == 0.05 and res.report["config"]["retain_rank"] == 0  # head: no retain subspace
    assert res.report["config"]["extract"]["kind"] == "gradient" and len(res.report["info"]["sweep"]) >= 1
    assert speaker_rule(4).forget_target == SPEAKER_FORGET_TARGET and swept_overrides("grad_diff") == {}
    assert speaker_rule(4, forget_target=chance_error_rate(4)).forget_target == pytest.approx(0.75)
    with pytest.raises(ValueError, match="between chance"):
        speaker_rule(4, forget_target=0.5)  # below chance is no forgetting at all
    with pytest.raises(ValueError, match="auto"):
        unlearn(speaker_dir, forget=forget, retain=retain, rule="always", device="cpu", progress=False)
