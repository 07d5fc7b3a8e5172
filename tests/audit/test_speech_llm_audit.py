"""The speech-LLM audit (teacher-forced NLL measures, quantisation and relearning) on a tiny random-init model."""

import pytest

from mmunlearn.audit import AuditOptions
from mmunlearn.audit.folder import audit_folder
from tests.speech_corpus import llm_dir, one_thread, speaker_manifests  # noqa: F401  (fixtures)


def test_speech_llm_audit_of_a_harness_folder_and_of_the_retain_model_itself(llm_dir, speaker_manifests, tmp_path):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from mmunlearn.audit.folder import audit_speech_llm_folder
    from mmunlearn.data.utterances import split_rows
    from mmunlearn.methods import UnlearnRequest, run_unlearning
    from mmunlearn.speech.spoken_qa import spoken_qa, texts_of

    texts = texts_of(spoken_qa(split_rows(speaker_manifests, "train"), ("speaker", "gender")))
    other = SpeechLLMAdapter.build("tiny", texts=texts, family="qwen2_5_omni", seed=1)
    other.save(tmp_path / "retain")
    target = SpeechLLMAdapter.from_pretrained(llm_dir, device="cpu")
    forget = spoken_qa(split_rows(speaker_manifests, "spk_forget_train"), ("speaker",))
    retain = spoken_qa(split_rows(speaker_manifests, "spk_retain_train"), ("speaker",))[:8]
    run_unlearning(
        UnlearnRequest(
            "grad_ascent",
            "speech-llm",
            size="tiny",
            overrides={"epochs": 1},
            out=tmp_path / "ga",
            inputs=[llm_dir],
            progress=False,
        ),
        target,
        forget,
        retain,
    )
    opts = AuditOptions(relearn_steps=2, relearn_batch_size=4, bits=(4,))
    ga = audit_speech_llm_folder(
        tmp_path / "ga",
        llm_dir,
        tmp_path / "retain",
        speaker_manifests,
        method="grad_ascent",
        options=opts,
        device="cpu",
        progress=False,
    )
    assert ga["model_kind"] == "speech-llm" and set(ga["skipped"]) == {"paraphrase", "probe"}
    assert {"none", "quantise_4bit", "relearn"} <= set(ga["attacks"])
    assert ga["white_box"]["weights_equal_target"] is False
    # dispatch by the folder's report, and the ratio of the retain model against ga is exactly 1
    via_folder = audit_folder(
        tmp_path / "ga", llm_dir, tmp_path / "retain", speaker_manifests, options=opts, device="cpu", progress=False
    )
    assert via_folder["attacks"]["none"]["unlearned"] == ga["attacks"]["none"]["unlearned"]
    from mmunlearn.audit.runner import audit_nll

    same = audit_nll(
        other, target, other, forget, method="retain ga", model_kind="speech-llm", options=opts, progress=False
    )
    assert same["summary"]["kept_none"] == pytest.approx(1.0) and same["summary"]["kept_relearn"] == pytest.approx(1.0)
