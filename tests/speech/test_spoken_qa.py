"""Tests of the spoken-QA tasks for speech LLMs: example building from manifests, accuracy, training."""

import doctest

import pytest
import torch

import mmunlearn.speech.spoken_qa as llm_tasks
from mmunlearn.data.utterances import split_rows
from mmunlearn.speech.spoken_qa import (
    QUESTIONS,
    by_task,
    labelled_qa,
    spoken_qa,
    task_accuracy,
    texts_of,
    train_speech_llm,
)
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)


def test_doctests():
    result = doctest.testmod(llm_tasks)
    assert result.attempted > 0 and result.failed == 0


def test_examples_from_manifests_carry_audio_question_and_answer(speaker_manifests):
    rows = split_rows(speaker_manifests, "train")
    before = [dict(r) for r in rows]
    exs = spoken_qa(rows, ("speaker", "gender", "transcript"))
    assert rows == before  # inputs untouched
    assert len(exs) == 3 * len(rows)
    for i, row in enumerate(rows):
        spk, gen, txt = exs[3 * i : 3 * i + 3]
        for ex in (spk, gen, txt):
            assert (ex["wav"], ex["start"], ex["stop"], ex["utt"]) == (row["wav"], row["start"], row["stop"], row["ID"])
        assert spk["question"] == QUESTIONS["speaker"] and spk["answer"] == row["spk_id"]
        assert gen["answer"] == {"m": "male", "f": "female"}[row["gender"]]
        assert txt["answer"] == row["text"] and txt["ID"] == f"{row['ID']}::transcript"
    assert {ex["answer"] for ex in by_task(exs, "gender")} == {"male", "female"}
    names = {r["spk_id"]: f"Speaker {r['spk_id'][-1]}" for r in rows}
    assert spoken_qa(rows[:1], ("speaker",), names=names)[0]["answer"] == names[rows[0]["spk_id"]]


def test_gender_from_meta_and_clear_errors(speaker_manifests):
    row = {k: v for k, v in split_rows(speaker_manifests, "train")[0].items() if k not in ("gender", "text")}
    assert spoken_qa([row], ("gender",), meta={row["spk_id"]: "f"})[0]["answer"] == "female"
    with pytest.raises(ValueError, match="no gender"):
        spoken_qa([row], ("gender",))
    with pytest.raises(ValueError, match="no transcript"):
        spoken_qa([row], ("transcript",))
    with pytest.raises(ValueError, match="unknown task"):
        spoken_qa([row], ("age",))
    pairs = labelled_qa([("/x/a.wav", "id00007"), (torch.zeros(10), "id00002")])
    assert [(e["wav"] if isinstance(e["wav"], str) else "tensor", e["answer"]) for e in pairs] == [
        ("/x/a.wav", "id00007"),
        ("tensor", "id00002"),
    ]


class _Canned:
    """A stand-in adapter whose greedy answers are given."""

    def __init__(self, answers):
        self.answers = answers
        self.model = torch.nn.Linear(1, 1)
        self.tokenizer = lambda text, add_special_tokens: {"input_ids": list(text)}  # one token per character

    def generate(self, examples, max_new_tokens, batch_size, desc):
        assert max_new_tokens == max(len(ex["answer"]) for ex in examples) + 2
        return self.answers[: len(examples)]


def test_task_accuracy_is_normalised_exact_match():
    exs = [{"task": "speaker", "question": "q", "answer": a} for a in ("id00001", "id00002", "id00001", "id00002")]
    acc, got = task_accuracy(_Canned(["ID00001.", "id00001", " id00001 ", "id0000"]), exs)
    assert acc == 0.5 and got[0] == "ID00001."
    with pytest.raises(ValueError, match="one task"):
        task_accuracy(_Canned([]), exs[:1] + [{"task": "gender", "question": "q", "answer": "male"}])
    transcript = [{"task": "transcript", "question": "q", "answer": "the river opened"}]
    assert task_accuracy(_Canned(["the river"]), transcript)[0] == pytest.approx(2 / 3)


def test_training_fits_the_answers_of_a_tiny_model(speaker_manifests):
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter

    exs = spoken_qa(split_rows(speaker_manifests, "spk_retain_train")[:4], ("speaker", "gender"))
    adapter = SpeechLLMAdapter.build("tiny", texts=texts_of(exs), family="qwen2_5_omni", seed=0)
    vision = {n: p.clone() for n, p in adapter.model.named_parameters() if "visual." in n}
    before = float(adapter.answer_nll(exs).mean())
    result = train_speech_llm(adapter, exs, epochs=6, batch_size=4, lr=1e-2, schedule="constant", progress=False)
    after = float(adapter.answer_nll(exs).mean())
    assert after < 0.5 * before and len(result.losses) == 12
    assert all(torch.equal(p, vision[n]) for n, p in adapter.model.named_parameters() if "visual." in n)
