"""The speaker-classifier audit on a tiny ECAPA and the synthetic espeak corpus: the function the VoxCeleb2
recipe's --audit calls, and `mmunlearn audit` on a harness output folder of kind speaker."""

import json

import pytest

from mmunlearn.audit import AuditOptions
from mmunlearn.audit.folder import audit_folder, audit_speaker_models, speaker_rows
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)

FAST = AuditOptions(relearn_steps=3, relearn_batch_size=4, bits=(4,))


@pytest.fixture(scope="module")
def classifiers(speaker_manifests, tmp_path_factory):
    from mmunlearn.adapters.speaker.training import train_speaker_classifier, training_rows

    root = tmp_path_factory.mktemp("audit_speaker")
    for name, retain_only in (("original", False), ("retrained", True)):
        rows, speakers = training_rows(speaker_manifests, "speaker", retain_only=retain_only)
        adapter, _ = train_speaker_classifier(
            rows, speakers=speakers, preset="tiny", epochs=6, lr=5e-3, batch_size=8, device="cpu", progress=False
        )
        adapter.save(root / name)
    return root


def test_retrained_classifier_audited_against_itself_keeps_everything(classifiers, speaker_manifests):
    res = audit_speaker_models(
        classifiers / "retrained",
        classifiers / "original",
        classifiers / "retrained",
        speaker_manifests,
        method="retrained itself",
        options=FAST,
        device="cpu",
        progress=False,
    )
    s = res["summary"]
    assert s["measure"] == "forget_acc" and s["forget"] == res["attacks"]["none"]["unlearned"]["forget_acc"]
    assert s["kept_none"] == pytest.approx(1.0) and s["relearn_recovery_ratio"] == pytest.approx(1.0)
    for key in ("kept_none", "kept_quantise_4bit", "kept_relearn"):
        assert s[key] in (None, pytest.approx(1.0)), key  # None only when original and retrained agree
    probe = res["attacks"]["probe"]
    assert probe["unlearned"]["accuracy"] == probe["retain"]["accuracy"]
    assert 0.0 <= probe["target"]["accuracy"] <= 1.0
    assert res["attacks"]["paraphrase"]["what"].startswith("held-out recordings")
    rows = speaker_rows(speaker_manifests, "speaker")
    assert {str(r["spk_id"]) for r in rows["forget_rows"]} == set(rows["forget_speakers"])


def test_audit_folder_reads_a_speaker_harness_output(classifiers, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.data.utterances import split_rows
    from mmunlearn.methods import UnlearnRequest, run_unlearning

    original = SpeakerAdapter.load(classifiers / "original", device="cpu")
    run_unlearning(
        UnlearnRequest(
            "grad_ascent",
            "speaker",
            size="tiny",
            overrides={"epochs": 1},
            out=tmp_path / "ga",
            progress=False,
            meta={"level": "speaker"},
        ),
        original,
        split_rows(speaker_manifests, "spk_forget_train"),
        split_rows(speaker_manifests, "spk_retain_train"),
    )
    res = audit_folder(
        tmp_path / "ga",
        classifiers / "original",
        classifiers / "retrained",
        speaker_manifests,
        options=AuditOptions(attacks=("quantise",), bits=(8,)),
        device="cpu",
        progress=False,
    )
    assert res["model_kind"] == "speaker" and res["method"] == "grad_ascent" and res["level"] == "speaker"
    assert res["white_box"]["weights_equal_target"] is False
    q = res["attacks"]["quantise_8bit"]
    assert 0.0 <= q["unlearned"]["forget_acc"] <= 1.0
    json.dumps(res)  # JSON-able as it is written


def test_mmunlearn_audit_takes_a_plain_model_folder_with_the_speaker_defaults(classifiers, speaker_manifests, tmp_path):
    """`mmunlearn audit --model` on the original classifier (no unlearn_report.json): audited, reported as having no
    history, with the relearning defaults the recipe's --audit uses (one table, CAPABILITY_DEFAULTS)."""
    from typer.testing import CliRunner

    from mmunlearn.audit.folder import NO_HISTORY, detect_kind, folder_report
    from mmunlearn.audit.options import CAPABILITY_DEFAULTS, options_for
    from mmunlearn.cli import app
    from recipes.voxceleb2 import settings as cfg

    assert detect_kind(classifiers / "original") == "speaker" and detect_kind(tmp_path) is None
    assert folder_report(classifiers / "original") == {"method": NO_HISTORY, "model_kind": "speaker"}
    assert cfg.audit_options() == options_for("speaker")  # --audit and `mmunlearn audit`: the same defaults
    assert (
        options_for("speaker").relearn_steps
        == CAPABILITY_DEFAULTS["is_classifier"]["relearn_steps"]
        != options_for("text").relearn_steps
    )
    res = CliRunner().invoke(
        app,
        [
            "audit",
            "--model",
            str(classifiers / "original"),
            "--target",
            str(classifiers / "original"),
            "--retain-model",
            str(classifiers / "retrained"),
            "--data",
            str(speaker_manifests),
            "--attacks",
            "relearn",
            "--out",
            str(tmp_path / "audit"),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    written = json.loads((tmp_path / "audit" / "AUDIT.json").read_text())
    (result,) = written["results"]
    assert result["method"] == NO_HISTORY and result["options"]["relearn_steps"] == 5
    assert result["options"]["relearn_lr"] == CAPABILITY_DEFAULTS["is_classifier"]["relearn_lr"]
    bad = CliRunner().invoke(
        app,
        [
            "audit",
            "--model",
            str(tmp_path),
            "--target",
            str(classifiers / "original"),
            "--retain-model",
            str(classifiers / "retrained"),
            "--data",
            str(speaker_manifests),
        ],
    )
    assert bad.exit_code == 2 and "neither an" in " ".join(bad.output.split())
