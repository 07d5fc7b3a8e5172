"""Spoken-QA tasks on VoxCeleb2-style manifests for speech LLMs: build the examples, score them, train on them.

Every manifest row (an utterance) yields one example per task, the audio plus a question:

* ``speaker``: "Who is speaking?" -> the speaker's ID (or a name from ``names``): the knowledge to forget;
* ``gender``: "Is the speaker male or female?" -> ``male`` / ``female`` (the manifest's ``gender``
  column, written by ``prepare`` from ``vox2_meta.csv``, or a ``meta`` mapping): the default target
  task, which must survive on the same audio;
* ``transcript``: "What does the speaker say?" -> the ``text`` column (where the corpus has transcripts).

Accuracy (:func:`task_accuracy`) is exact match of the greedy answer after normalisation (case,
punctuation, spaces) for ``speaker`` and ``gender``; for ``transcript`` it is the mean ROUGE-L
recall of the generation against the transcript (exact sentences are too strict a bar).

>>> rows = [{"ID": "u1", "wav": "/a.wav", "start": 0, "stop": 16000, "spk_id": "id00001", "gender": "f"}]
>>> [(e["task"], e["question"], e["answer"]) for e in spoken_qa(rows)]
[('speaker', 'Who is speaking?', 'id00001'), ('gender', 'Is the speaker male or female?', 'female')]
>>> normalise(" Female. "), normalise("id00001!")
('female', 'id00001')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmunlearn.metrics.rouge import rouge_scores
from mmunlearn.train import TrainConfig, TrainResult, train

QUESTIONS = {
    "speaker": "Who is speaking?",
    "gender": "Is the speaker male or female?",
    "transcript": "What does the speaker say?",
}
TASKS = tuple(QUESTIONS)
GENDERS = {"m": "male", "male": "male", "f": "female", "female": "female"}
#: After the audio warm-up, the mini preset fits the built-in corpus with this on one CPU thread in about two
#: minutes, warm-up included (measured: 8 speakers, 144 utterances x 2 questions, 118 s, final loss 0.008).
DEFAULT_TRAIN = TrainConfig(epochs=12, batch_size=16, lr=3e-3, schedule="onecycle", weight_decay=0.0)
#: Audio-tower warm-up (speaker classification) before spoken-QA training, see :func:`warm_up_audio_tower`.
DEFAULT_WARM_UP = TrainConfig(epochs=20, batch_size=16, lr=5e-3, schedule="onecycle", weight_decay=0.0)

_PUNCT = re.compile(r"[^\w\s]")


def normalise(text: str) -> str:
    """Lower case, punctuation removed, runs of spaces collapsed."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def _answer(task: str, row: Mapping[str, Any], meta: Mapping[str, str] | None, names: Mapping[str, str] | None) -> str:
    spk = str(row.get("spk_id", ""))
    if task == "speaker":
        if not spk:
            raise ValueError(f"row {row.get('ID', '?')!r} has no spk_id")
        return str(names.get(spk, spk)) if names else spk
    if task == "gender":
        raw = str(row.get("gender") or (meta or {}).get(spk, "")).strip().lower()
        if raw not in GENDERS:
            raise ValueError(
                f"row {row.get('ID', '?')!r} (speaker {spk}): no gender (got {raw!r}); pass meta= "
                "(speaker -> m/f, e.g. from vox2_meta.csv) or use manifests with a gender column"
            )
        return GENDERS[raw]
    text = str(row.get("text") or "").strip()
    if not text:
        raise ValueError(f"row {row.get('ID', '?')!r} has no transcript ('text' column) for the transcript task")
    return text


def spoken_qa(
    rows: Iterable[Mapping[str, Any]],
    tasks: Sequence[str] = ("speaker", "gender"),
    *,
    meta: Mapping[str, str] | None = None,
    names: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One example per (row, task), in row order: the row's audio fields, ``question``, ``answer``,
    ``task``, ``utt`` (the row ID) and ``ID`` (``<row ID>::<task>``). Rows are not modified."""
    unknown = [t for t in tasks if t not in QUESTIONS]
    if unknown or not tasks:
        raise ValueError(f"unknown task(s) {unknown}; choose from {TASKS}")
    out = []
    for i, row in enumerate(rows):
        if "wav" not in row:
            raise ValueError(f"row {i} ({row.get('ID', '?')!r}) has no 'wav'")
        audio = {k: row[k] for k in ("wav", "start", "stop") if k in row}
        utt = str(row.get("ID", i))
        for task in tasks:
            out.append(
                {
                    **audio,
                    "ID": f"{utt}::{task}",
                    "utt": utt,
                    "spk_id": str(row.get("spk_id", "")),
                    "task": task,
                    "question": QUESTIONS[task],
                    "answer": _answer(task, row, meta, names),
                }
            )
    return out


def labelled_qa(items: Iterable[tuple[Any, str]], task: str = "speaker") -> list[dict[str, Any]]:
    """Examples from (audio, label) pairs: the audio a file path or a 1-D waveform, the label the answer
    (a speaker name/ID for ``speaker``, ``m``/``f``/``male``/``female`` for ``gender``, text for ``transcript``)."""
    rows = []
    for i, (audio, label) in enumerate(items):
        row: dict[str, Any] = {"ID": f"item{i}", "wav": audio if not hasattr(audio, "__fspath__") else str(audio)}
        row.update({"speaker": {"spk_id": label}, "gender": {"gender": label}, "transcript": {"text": label}}[task])
        rows.append(row)
    return spoken_qa(rows, (task,))


def texts_of(examples: Iterable[Mapping[str, Any]]) -> list[str]:
    """Questions and answers (the texts a tokenizer built for these tasks must cover)."""
    return [t for ex in examples for t in (ex["question"], ex["answer"])]


def by_task(examples: Sequence[Mapping[str, Any]], task: str) -> list[Mapping[str, Any]]:
    return [ex for ex in examples if ex["task"] == task]


def task_accuracy(
    adapter,
    examples: Sequence[Mapping[str, Any]],
    *,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    desc: str | None = None,
) -> tuple[float, list[str]]:
    """(accuracy, greedy answers) on examples of one task (see the module notes for the measure)."""
    if not examples:
        raise ValueError("task_accuracy: no examples")
    tasks = {ex["task"] for ex in examples}
    if len(tasks) != 1:
        raise ValueError(f"task_accuracy scores one task at a time, got {sorted(tasks)}")
    if max_new_tokens is None:
        longest = max(len(adapter.tokenizer(ex["answer"], add_special_tokens=False)["input_ids"]) for ex in examples)
        max_new_tokens = longest + 2
    was_training = adapter.model.training
    adapter.model.eval()
    try:
        answers = adapter.generate(list(examples), max_new_tokens=max_new_tokens, batch_size=batch_size, desc=desc)
    finally:
        adapter.model.train(was_training)
    refs = [ex["answer"] for ex in examples]
    if tasks == {"transcript"}:
        return float(np.mean(rouge_scores(answers, refs)["rougeL_recall"])), answers
    return float(np.mean([normalise(a) == normalise(r) for a, r in zip(answers, refs)])), answers


def train_speech_llm(
    adapter,
    examples: Sequence[Mapping[str, Any]],
    config: TrainConfig | None = None,
    *,
    device: str = "auto",
    progress: bool = True,
    desc: str = "train speech LLM",
    **overrides: Any,
) -> TrainResult:
    """Fine-tune ``adapter.model`` on spoken-QA examples with the shared loop (answer-token NLL).

    Trains every parameter but the (unused) vision tower; ``config`` (default :data:`DEFAULT_TRAIN`)
    with ``overrides`` (e.g. ``epochs=5``) goes to :func:`mmunlearn.train.train`.
    """
    if len(examples) == 0:
        raise ValueError("no training examples given")
    cfg = (config or DEFAULT_TRAIN).replace(**overrides)
    params = [p for n, p in adapter.model.named_parameters() if "visual." not in n]
    result = train(
        adapter.model,
        lambda m, b: adapter.loss(b, model=m),
        list(examples),
        adapter.collate,
        cfg,
        params=params,
        device=device,
        progress=progress,
        desc=desc,
    )
    adapter.model.eval()
    return result


class _SpeakerProbe(nn.Module):
    """The audio tower (inside ``model``) plus a linear speaker classifier on mean+std pooled audio embeddings."""

    def __init__(self, adapter, n_speakers: int):
        super().__init__()
        self.adapter, self.model = adapter, adapter.model
        dim = adapter.model.get_input_embeddings().weight.shape[1]
        self.head = nn.Linear(2 * dim, n_speakers)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        clips = self.adapter.audio_embeddings(batch, model=self.model)
        pooled = torch.stack(
            [torch.cat([c.mean(0), c.std(0) if len(c) > 1 else torch.zeros_like(c[0])]) for c in clips]
        )
        return self.head(pooled.float())


def warm_up_audio_tower(
    adapter,
    rows: Sequence[Mapping[str, Any]],
    config: TrainConfig | None = None,
    *,
    device: str = "auto",
    progress: bool = True,
    **overrides: Any,
) -> TrainResult:
    """Pre-train the audio tower (and projector) as a speaker classifier before spoken-QA training.

    A throw-away linear head reads the mean and standard deviation over time of the tower's outputs
    (x-vector style statistics pooling; Snyder et al., 2018, "X-Vectors"); cross-entropy over the
    rows' speakers. Only the audio parameters train, so the tower starts QA training already carrying
    speaker identity, as a pretrained speech encoder does; from random init a small model learns it
    very slowly through the language-model loss alone. ``config`` (default :data:`DEFAULT_WARM_UP`)
    with ``overrides`` goes to :func:`mmunlearn.train.train`.
    """
    speakers = sorted({str(r["spk_id"]) for r in rows})
    if len(speakers) < 2:
        raise ValueError(f"warming up the audio tower needs two or more speakers, got {speakers}")
    index = {s: i for i, s in enumerate(speakers)}
    examples = [
        {
            **{k: r[k] for k in ("wav", "start", "stop") if k in r},
            "spk_id": str(r["spk_id"]),
            "question": QUESTIONS["speaker"],
            "answer": str(r["spk_id"]),
        }
        for r in rows
    ]
    probe = _SpeakerProbe(adapter, len(speakers))
    audio = [p for n, p in adapter.model.named_parameters() if "audio_tower." in n or "multi_modal_projector." in n]

    def collate(items):
        batch = adapter.collate(items)
        batch["speaker"] = torch.tensor([index[it["spk_id"]] for it in items])
        return batch

    def loss_fn(model, batch):
        return F.cross_entropy(model(batch), batch["speaker"].to(batch["input_features"].device))

    cfg = (config or DEFAULT_WARM_UP).replace(**overrides)
    result = train(
        probe,
        loss_fn,
        examples,
        collate,
        cfg,
        params=audio + list(probe.head.parameters()),
        device=device,
        progress=progress,
        desc="warm up audio tower",
    )
    adapter.model.eval()
    return result


@torch.no_grad()
def answer_nll(adapter, examples: Sequence[Mapping[str, Any]], batch_size: int = 16) -> np.ndarray:
    """Per-example mean answer-token NLL (the loss attack's membership score), float64."""
    was_training = adapter.model.training
    adapter.model.eval()
    try:
        return adapter.answer_nll(list(examples), batch_size=batch_size).numpy()
    finally:
        adapter.model.train(was_training)
