"""voxceleb2 ``--model hf-audio`` on the tiny espeak corpus: a tiny wav2vec2 classifier built from a config, trained
(original and retrained), unlearned by every applicable method through the harness, evaluated into the ECAPA
tables; each method's folder is of the hf-audio kind, restores bit for bit and runs in ``transformers.pipeline``."""

import hashlib
import json
from dataclasses import asdict

import numpy as np
import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from mmunlearn.adapters.hf_audio import training as hf
from mmunlearn.api.restore import restore_folder
from mmunlearn.kinds import kind_of
from recipes.voxceleb2 import pipeline as pipe
from recipes.voxceleb2 import settings as cfg
from recipes.voxceleb2.cli import app
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)

METRICS = {"forget_acc", "forget_test_acc", "retain_acc", "test_acc", "eer", "forget_any_acc"}


@pytest.fixture(scope="module")
def hf_run(speaker_manifests, tmp_path_factory):  # noqa: F811
    """Every classifier method, unswept, on a tiny hf-audio classifier trained 6 epochs."""
    work = tmp_path_factory.mktemp("vox_hf")
    res = CliRunner().invoke(
        app,
        [
            "speaker",
            "--model",
            "hf-audio",
            "--manifests",
            str(speaker_manifests),
            "--workdir",
            str(work),
            "--methods",
            "all",
            "--no-sweep",
            "--preset",
            "tiny",
            "--train-epochs",
            "6",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    out = work / "hf-audio" / "speaker"  # the default --out of this model: beside, not over, the ECAPA tables
    return out, json.loads((out / "speaker.json").read_text())


def test_every_method_runs_through_the_harness_into_the_ecapa_table(hf_run):
    out, table = hf_run
    rows = table["rows"]
    assert [r["method"] for r in rows] == ["original model", "retrained model", *cfg.CLASSIFIER_METHODS]
    for r in rows:
        assert METRICS <= set(r) and all(0.0 <= r[k] <= 1.0 for k in METRICS), r
    assert table["context"]["model"]["model"] == "hf-audio" and table["context"]["model"]["size"] == "tiny"
    original = table["context"]["original"]
    assert kind_of(original).name == kind_of(table["context"]["retrained"]).name == "hf-audio"
    assert json.loads(open(f"{original}/train_log.json").read())["spec"]["model"] == "hf-audio"
    assert rows[0]["forget_acc"] > rows[1]["forget_acc"]  # the original knows the forget speaker better than retraining
    for r in rows[2:]:
        run = json.loads((out / r["method"] / "run.json").read_text())
        assert run["row"] == r and r["scope"] == "all" and 0.0 < r["changed_fraction"] <= 1.0
        report = json.loads((out / r["method"] / "model" / "unlearn_report.json").read_text())
        assert report["model_kind"] == "hf-audio" and report["method"] == r["method"]
    assert (out / "speaker.md").read_text().count("| grad_diff |") == 1


def test_train_reuses_the_cached_hf_audio_model_and_copies_it_out(hf_run, speaker_manifests, tmp_path):  # noqa: F811
    out, table = hf_run
    work = out.parent.parent
    models = sorted(p.name for p in (work / "models").iterdir())
    res = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            "hf-audio",
            "--manifests",
            str(speaker_manifests),
            "--workdir",
            str(work),
            "--preset",
            "tiny",
            "--train-epochs",
            "6",
            "--out",
            str(tmp_path / "copy"),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    assert sorted(p.name for p in (work / "models").iterdir()) == models  # the speaker run's model, not a new one
    assert kind_of(tmp_path / "copy").name == "hf-audio"
    original = load_file(f"{table['context']['original']}/model.safetensors")
    copied = load_file(str(tmp_path / "copy" / "model.safetensors"))
    assert all(np.array_equal(original[k].numpy(), copied[k].numpy()) for k in original)


@pytest.mark.parametrize("method", ["qr-erase", "npo"])
def test_each_method_folder_restores_bit_for_bit_and_runs_in_the_transformers_pipeline(hf_run, method, tmp_path):
    from transformers import pipeline

    out, table = hf_run
    folder = out / method / "model"
    original = load_file(f"{table['context']['original']}/model.safetensors")
    edited = load_file(str(folder / "model.safetensors"))
    assert any(not np.array_equal(original[k].numpy(), edited[k].numpy()) for k in original)
    restored = load_file(str(restore_folder(folder, tmp_path / "restored", progress=False) / "model.safetensors"))
    assert restored.keys() == original.keys() and all(
        np.array_equal(restored[k].numpy(), original[k].numpy()) for k in original
    )
    classify = pipeline("audio-classification", model=str(folder), device="cpu")
    wave = np.random.default_rng(0).standard_normal(8000).astype(np.float32)
    labels = classify({"raw": wave, "sampling_rate": 16000}, top_k=table["context"]["classes"])
    speakers = {r["spk_id"] for r in pipe.split_rows(table["context"]["manifests"], "train")}
    assert {x["label"] for x in labels} == speakers and abs(sum(x["score"] for x in labels) - 1) < 1e-4


def test_ecapa_cache_keys_are_unchanged_and_hf_audio_models_get_their_own(speaker_manifests):  # noqa: F811
    from mmunlearn.adapters.speaker.adapter import SCORING_VERSION

    rows = pipe.split_rows(speaker_manifests, "train")
    speakers = sorted({r["spk_id"] for r in rows})
    ecapa = pipe.ModelSpec("original", "tiny", {"epochs": 1}, 2.0, 0)
    before = {k: v for k, v in asdict(ecapa).items() if k != "model"}  # the key as computed before hf-audio
    old = hashlib.sha256(
        json.dumps([before, pipe.rows_digest(rows), speakers, SCORING_VERSION], sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    assert ecapa.key(rows, speakers) == old
    assert pipe.ModelSpec("original", "tiny", {"epochs": 1}, 2.0, 0, "hf-audio").key(rows, speakers) != old


def _rerun(hf_run, manifests, out, *args: str):
    """A speaker run over hf_run's cached tiny models (same workdir and training settings) into ``out``."""
    res = CliRunner().invoke(
        app,
        [
            "speaker",
            "--model",
            "hf-audio",
            "--manifests",
            str(manifests),
            "--workdir",
            str(hf_run[0].parent.parent),
            "--out",
            str(out),
            "--methods",
            "qr-erase",
            "--preset",
            "tiny",
            "--train-epochs",
            "6",
            "--device",
            "cpu",
            "--threads",
            "1",
            *args,
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    return json.loads((out / "speaker.json").read_text())


def _changed(original: dict, folder) -> set[str]:
    edited = load_file(str(folder / "model.safetensors"))
    assert edited.keys() == original.keys()
    return {k for k in original if not np.array_equal(original[k].numpy(), edited[k].numpy())}


@pytest.mark.parametrize("scope", ["head", "embedding"])
def test_the_head_and_embedding_scopes_edit_their_weights_alone(
    hf_run,
    speaker_manifests,
    scope,  # noqa: F811
    tmp_path,
):
    """As on ECAPA: --scope head edits the class rows (the adapter's head_weight) and leaves every other tensor bit
    for bit; --scope embedding leaves the head bit for bit."""
    table = _rerun(hf_run, speaker_manifests, tmp_path, "--scope", scope, "--no-sweep")
    original = load_file(f"{table['context']['original']}/model.safetensors")
    changed = _changed(original, tmp_path / "qr-erase" / "model")
    head = {"classifier.weight", "classifier.bias"}
    if scope == "head":
        assert changed == {"classifier.weight"}  # the head's bias and everything below it: bit for bit
    else:
        assert changed and not changed & head and all(k.endswith(".weight") for k in changed)
    row = table["rows"][2]
    run = json.loads((tmp_path / "qr-erase" / "run.json").read_text())
    report = json.loads((tmp_path / "qr-erase" / "model" / "unlearn_report.json").read_text())
    assert row["method"] == "qr-erase" and row["scope"] == run["row"]["scope"] == report["scope"] == scope
    assert report["model_kind"] == "hf-audio" and run["scopes_tried"] is None  # one scope: nothing to choose
    assert (report["config"]["retain_rank"] == 0) == (scope == "head")  # no retain subspace in the head (SCOPE_OPTIONS)
    assert table["context"]["original"] == hf_run[1]["context"]["original"]  # the cached model, not a new one


def test_the_default_with_sweep_tries_the_head_first(hf_run, speaker_manifests, tmp_path):  # noqa: F811
    """hf-audio's default scope is ECAPA's: with --sweep every scope of SWEEP_SCOPES, the head first, the rule's
    choice in <method>/model."""
    table = _rerun(hf_run, speaker_manifests, tmp_path, "--sweep", "--sweep-ranks", "1", "--retain-bound", "0.5")
    run = json.loads((tmp_path / "qr-erase" / "run.json").read_text())
    assert list(run["scopes_tried"]) == list(cfg.SWEEP_SCOPES) and cfg.SWEEP_SCOPES[0] == "head"
    assert table["rows"][2]["scope"] == run["row"]["scope"] in cfg.SWEEP_SCOPES
    original = load_file(f"{table['context']['original']}/model.safetensors")
    head = tmp_path / "qr-erase" / "scopes" / "head" / "model"
    assert json.loads((head / "unlearn_report.json").read_text())["scope"] == "head"
    assert _changed(original, head) <= {"classifier.weight"}


def test_an_unknown_model_is_refused_before_any_work(tmp_path):
    res = CliRunner().invoke(app, ["speaker", "--model", "wavlm", "--workdir", str(tmp_path)])
    assert res.exit_code != 0 and "hf-audio" in res.output and not (tmp_path / "corpus").exists()


def test_the_model_config_is_built_locally_and_scores_do_not_depend_on_the_batch(speaker_manifests):  # noqa: F811
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    rows = pipe.split_rows(speaker_manifests, "spk_retain_test")[:5]
    adapter = HFAudioAdapter.build(hf.model_config("tiny"), ["a", "b", "c"], hf.feature_extractor(), device="cpu")
    assert hf.size_of("base") == "large" and adapter.model.config.hidden_size == hf.SIZES["tiny"]["hidden_size"]
    batch = adapter.collate(rows, require_labels=False)
    assert "attention_mask" in batch and len(set(batch["lengths"].tolist())) > 1  # one padded pass
    together = adapter.logits(batch).detach().numpy()
    alone = np.stack([adapter.logits(adapter.collate([r], require_labels=False)).detach().numpy()[0] for r in rows])
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-4)
