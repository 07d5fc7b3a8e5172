"""A speaker classifier as a user would build it with plain transformers: a small wav2vec2 trained on FSDD clips.

Nothing of mmunlearn is used here: a ``Wav2Vec2ForSequenceClassification`` from a small ``Wav2Vec2Config`` (trained
from scratch, never downloaded), a ``Wav2Vec2FeatureExtractor``, a plain torch training loop over ``path,label`` CSVs
(16 kHz WAV files), and ``save_pretrained`` of both, so ``pipeline("audio-classification", model=OUT)`` runs the
folder. ``examples/byo_fsdd.py`` runs it twice: the original model (every training clip) and the retrained reference
(``--exclude SPEAKER``: the same labels, none of that speaker's clips).

    python examples/byo_fsdd_wav2vec2.py --train train.csv --test test.csv --out models/w2v2 [--exclude jackson]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

RATE = 16000


def read_rows(path: Path) -> list[tuple[str, str]]:
    """(audio path, label) rows of a ``path,label`` CSV."""
    with open(path, newline="") as f:
        rows = [(r["path"], r["label"]) for r in csv.DictReader(f)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def small_config(labels: list[str]) -> Wav2Vec2Config:
    """A wav2vec2 of about 0.1 M parameters: three layer-normed convolutions (100 frames per second), two transformer
    layers 64 wide, mean pooling, a projection of 32 and the class rows."""
    return Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_kernel=(10, 8, 4),
        conv_stride=(10, 4, 4),
        conv_bias=True,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0,
        mask_feature_prob=0.0,
        layerdrop=0.0,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        classifier_proj_size=32,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={s: i for i, s in enumerate(labels)},
    )


def load_audio(path: str) -> np.ndarray:
    wav, rate = sf.read(path, dtype="float32", always_2d=False)
    if rate != RATE:
        raise ValueError(f"{path}: {rate} Hz, expected {RATE} (use the manifests' converted WAVs)")
    return wav if wav.ndim == 1 else wav.mean(axis=1)


def batches(clips: list[np.ndarray], ys: list[int], size: int, rng: random.Random, crop: int):
    order = list(range(len(clips)))
    rng.shuffle(order)
    for i in range(0, len(order), size):
        picked = order[i : i + size]
        out = []
        for j in picked:
            wav = clips[j]
            if len(wav) > crop:
                start = rng.randrange(len(wav) - crop + 1)
                wav = wav[start : start + crop]
            out.append(wav)
        yield out, torch.tensor([ys[j] for j in picked])


def accuracy(model, fe, clips: list[np.ndarray], ys: list[int]) -> float:
    """Share of clips classified right, one clip at a time (as the pipeline runs them)."""
    model.eval()
    right = 0
    with torch.no_grad():
        for wav, y in zip(clips, ys):
            enc = fe(wav, sampling_rate=RATE, return_tensors="pt")
            right += int(model(**enc).logits.argmax(-1).item() == y)
    return right / len(clips)


def train(
    train_csv: Path,
    out: Path,
    test_csv: Path | None = None,
    exclude: str | None = None,
    epochs: int = 6,
    lr: float = 3e-3,
    batch_size: int = 16,
    crop_seconds: float = 1.0,
    seed: int = 0,
) -> dict:
    """Train, save with ``save_pretrained`` to ``out`` and return what was measured (also ``out/training.json``)."""
    torch.manual_seed(seed)
    rows = read_rows(train_csv)
    labels = sorted({label for _, label in rows})
    if exclude is not None and exclude not in labels:
        raise ValueError(f"--exclude {exclude!r} is no label of {train_csv}")
    kept = [(p, label) for p, label in rows if label != exclude]
    clips = [load_audio(p) for p, _ in kept]
    ys = [labels.index(label) for _, label in kept]
    fe = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=RATE, padding_value=0.0, do_normalize=True, return_attention_mask=True
    )
    model = Wav2Vec2ForSequenceClassification(small_config(labels))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * math.ceil(len(clips) / batch_size)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, steps - warm)))))
    )
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        total, n = 0.0, 0
        for wavs, y in batches(clips, ys, batch_size, rng, int(crop_seconds * RATE)):
            enc = fe(wavs, sampling_rate=RATE, padding=True, return_tensors="pt")
            loss = torch.nn.functional.cross_entropy(model(**enc).logits, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total, n = total + loss.item() * len(y), n + len(y)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / n:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    seconds = time.perf_counter() - t0
    facts = {
        "train_csv": str(train_csv),
        "exclude": exclude,
        "clips": len(clips),
        "labels": labels,
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "crop_seconds": crop_seconds,
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(seconds, 1),
        "train_acc": accuracy(model, fe, clips, ys),
    }
    if test_csv is not None:
        test = read_rows(test_csv)
        facts["test_acc"] = accuracy(model, fe, [load_audio(p) for p, _ in test], [labels.index(s) for _, s in test])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fe.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, required=True, help="path,label CSV of the training clips")
    ap.add_argument("--out", type=Path, required=True, help="save_pretrained folder to write")
    ap.add_argument("--test", type=Path, help="path,label CSV of held-out clips (accuracy reported)")
    ap.add_argument("--exclude", help="a label whose clips are left out (the retrained reference)")
    ap.add_argument("--epochs", type=int, default=6, help="passes over the training clips")
    ap.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batch order")
    args = ap.parse_args()
    torch.set_num_threads(1)
    facts = train(args.train, args.out, args.test, args.exclude, epochs=args.epochs, lr=args.lr, seed=args.seed)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
