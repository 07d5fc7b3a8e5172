"""The speech-LLM VoxCeleb2 path on a tiny Qwen2.5-Omni-thinker-shaped model: the recipe's table and the
``mmunlearn voxceleb2 <level> --model speech-llm`` mount."""

import json

import pytest
from typer.testing import CliRunner

from recipes.voxceleb2 import speech_llm
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import FAST_OPTIONS


@pytest.mark.parametrize("where", ["audio", "text"])
def test_erasure_stays_in_the_chosen_tower_and_the_table_is_written(llm_dir, speaker_manifests, tmp_path, where):
    rows = speech_llm.run(
        speaker_manifests,
        llm_dir,
        tmp_path,
        level="speaker",
        methods=["qr-erase"],
        where=where,
        options=FAST_OPTIONS,
        device="cpu",
        progress=False,
    )
    assert [r["method"] for r in rows] == ["original", "qr-erase"]
    for key in ("forget_acc", "retain_acc", "test_acc", "target_acc", "forget_nll", "retain_nll"):
        assert all(0.0 <= r[key] <= 1.0 for r in rows) if key.endswith("acc") else all(r[key] > 0 for r in rows)
    selected = rows[1]["selected_layers"]
    assert selected and all(g.startswith(f"{where}.") for g in selected)
    report = json.loads((tmp_path / "qr-erase" / "model" / "erase_report.json").read_text())
    assert all(row["layer"].startswith(f"{where}.") for row in report["layers"])  # energy over that tower only
    run = json.loads((tmp_path / "qr-erase" / "run.json").read_text())  # the runner's layout: model/ and run.json
    assert run["row"] == rows[1] and run["method"] == "qr-erase" and run["context"]["where"] == where
    assert run["config"]["rank"] == FAST_OPTIONS["rank"] and run["info"]["selected_layers"] == selected
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["where"] == where and [r["method"] for r in saved["rows"]] == ["original", "qr-erase"]
    assert "| qr-erase |" in (tmp_path / "results.md").read_text()
    assert rows[1]["forget_nll"] > rows[0]["forget_nll"]  # erasing the forget direction raises its loss


def test_voxceleb2_cli_mounts_the_speech_llm_path(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.cli import app

    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "voxceleb2",
            "sample",
            "--model",
            "speech-llm",
            "--llm",
            str(llm_dir),
            "--manifests",
            str(speaker_manifests),
            "--methods",
            "grad_ascent",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--threads",
            "1",
            f"retrained={llm_dir}",
        ],
    )  # a stand-in: the reference row of a given folder
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "sample" / "results.json").read_text())
    assert saved["level"] == "sample"
    assert [r["method"] for r in saved["rows"]] == ["original", "retrain", "grad_ascent"]
    original, retrain = saved["rows"][:2]
    assert {k: v for k, v in retrain.items() if k != "method"} == {k: v for k, v in original.items() if k != "method"}
    assert 0.0 <= saved["rows"][0]["mia_auc"] <= 1.0
    assert "running grad_ascent (1/1)" in result.output and "[stage 1/1] grad_ascent:" in result.output  # one loop
    bad = CliRunner().invoke(
        app,
        ["voxceleb2", "speaker", "--model", "speech-llm", "--where", "vision", "--manifests", str(speaker_manifests)],
    )
    assert bad.exit_code != 0 and "--where" in bad.output


def test_a_swept_run_aims_at_the_retrained_models_forget_nll(llm_dir, speaker_manifests, tmp_path):
    """With ``sweep`` the rule's forget target is the retrained model's NLL on the forget answers, the verdict is in
    the row, and a row said to meet the rule has its forget NLL at the target with the retain rise in bound."""
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from mmunlearn.methods import mean_nll
    from mmunlearn.speech.spoken_qa import spoken_qa, texts_of

    texts = texts_of(spoken_qa(speech_llm.split_rows(speaker_manifests, "train"), ("speaker", "gender")))
    retrained = SpeechLLMAdapter.build("tiny", texts=texts, family="qwen2_5_omni", seed=1).save(tmp_path / "retrained")
    rows = speech_llm.run(
        speaker_manifests,
        llm_dir,
        tmp_path / "run",
        level="speaker",
        methods=["qr-erase"],
        where="text",
        options=FAST_OPTIONS,
        retrain_dir=retrained,
        sweep=True,
        device="cpu",
        progress=False,
    )
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    forget, _ = speech_llm.partitions(speaker_manifests, "speaker", "gender")
    want = mean_nll(SpeechLLMAdapter.load(retrained, device="cpu"), forget)
    assert saved["rule"]["forget_target"] == pytest.approx(want, rel=1e-5)
    assert "retrained model" in saved["rule"]["target_source"] and saved["rule"]["retain_bound"] == 0.1
    original, retrain, erased = rows
    assert retrain["method"] == "retrain" and erased["target_reached"] in (True, False)
    run = json.loads((tmp_path / "run" / "qr-erase" / "run.json").read_text())
    assert run["rule"] is not None
    if erased["target_reached"]:
        assert erased["forget_nll"] >= want - 1e-4 and erased["retain_nll"] - original["retain_nll"] <= 0.1 + 1e-4
    assert " rule met |" in (tmp_path / "run" / "results.md").read_text().splitlines()[0]


def test_the_cli_honours_the_rule_method_and_resume_settings_on_a_speech_llm(llm_dir, speaker_manifests, tmp_path):
    """``retain_bound``, ``lr``, ``epochs``, ``extract`` and ``strict`` reach the run (the rule in results.json, the
    methods' configs in run.json, exit status 1 on a missed rule); ``resume`` reuses a finished stage, ``resume=no``
    redoes it (once all were ignored on this path: the rule's bound was 0.1 whatever was set, resume always off)."""
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from mmunlearn.cli import app
    from mmunlearn.speech.spoken_qa import spoken_qa, texts_of

    texts = texts_of(spoken_qa(speech_llm.split_rows(speaker_manifests, "train"), ("speaker", "gender")))
    retrained = SpeechLLMAdapter.build("tiny", texts=texts, family="qwen2_5_omni", seed=1).save(tmp_path / "retrained")
    out = tmp_path / "out"
    command = [
        "voxceleb2",
        "speaker",
        "--model",
        "speech-llm",
        "--llm",
        str(llm_dir),
        "--manifests",
        str(speaker_manifests),
        "--methods",
        "qr-erase,grad_ascent",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--threads",
        "1",
        f"retrained={retrained}",
        "where=text",
        "retain_bound=0",
        "lr=0.003",
        "epochs=1",
        "extract=finetune",
        "extract_steps=2",
        "rank=2",
        "method.grad_ascent.batch_size=8",
    ]
    first = CliRunner().invoke(app, [*command, "strict=yes"])
    saved = json.loads((out / "speaker" / "results.json").read_text())
    assert saved["rule"]["retain_bound"] == 0.0  # the bound set, not the NLL rule's 0.1
    runs = {m: json.loads((out / "speaker" / m / "run.json").read_text()) for m in ("qr-erase", "grad_ascent")}
    assert (runs["grad_ascent"]["config"]["lr"], runs["grad_ascent"]["config"]["epochs"]) == (0.003, 1)
    assert runs["qr-erase"]["config"]["extract"]["kind"] == "finetune"
    assert runs["qr-erase"]["config"]["extract"]["steps"] == 2 and runs["qr-erase"]["config"]["sweep_ranks"] == [2]
    missed = [r["method"] for r in saved["rows"] if r.get("target_reached") is False]
    assert missed, "a bound of 0 nats should leave some method short of the retrained model's forget NLL"
    assert first.exit_code == 1 and f"sweep rule not met by {', '.join(missed)}" in first.output  # strict
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0, again.output
    rows = json.loads((out / "speaker" / "results.json").read_text())["rows"]
    assert all(r.get("reused") for r in rows if r["method"] in runs)  # resume, on by default: nothing redone
    redone = CliRunner().invoke(app, [*command, "resume=no"])
    assert redone.exit_code == 0, redone.output
    rows = json.loads((out / "speaker" / "results.json").read_text())["rows"]
    assert not any(r.get("reused") for r in rows)
