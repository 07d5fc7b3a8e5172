"""Build and train the whisper-smollm2 speech LLM (Whisper-tiny.en encoder + SmolLM2-135M-Instruct, Qwen2-Audio).

Stages (one progress line each, every stage resumable: rerun the same command after an interruption):
assemble (cached), tower outputs of the training clips (cached by clip and tower), projector training
(checkpointed), the trained folder ``OUT/model``, held-out accuracy per task in ``OUT/results.json``
(what ``mmunlearn report record`` takes):

    python -m data_prep.whisper_smollm2 --manifests runs/fsdd/manifests --out runs/whisper_smollm2
    python -m data_prep.whisper_smollm2 --assemble-only          # the untrained folder in the model cache

FSDD's manifests (``mmunlearn voxceleb2 prepare-corpus --root ../shared/data/fsdd --out runs/fsdd/manifests``)
carry the digit as a word, so ``--tasks speaker,transcript`` asks "Who is speaking?" and "What does the speaker
say?" (the digit) of the same clip.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from mmunlearn.errors import run_main
from mmunlearn.presets.whisper_smollm2 import PresetTraining, assembled_dir, train_preset


def main(argv: list[str] | None = None) -> Path:
    d = PresetTraining()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifests", type=Path, help="Manifests folder (prepare / prepare-corpus).")
    parser.add_argument("--out", type=Path, default=Path("runs/whisper_smollm2"), help="Run folder.")
    parser.add_argument("--tasks", default=",".join(d.tasks), help="Spoken-QA tasks, comma-separated.")
    parser.add_argument("--epochs", type=int, default=d.epochs, help="Passes over the training examples.")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="Examples per optimiser step.")
    parser.add_argument("--lr", type=float, default=d.lr, help="Peak learning rate (one-cycle schedule).")
    parser.add_argument(
        "--max-train-clips",
        type=int,
        default=d.max_train_clips,
        help="Train on this many clips, drawn evenly over speakers by the seed (0: all).",
    )
    parser.add_argument(
        "--max-test-clips",
        type=int,
        default=d.max_test_clips,
        help="Evaluate on this many held-out clips, drawn the same way (0: all).",
    )
    parser.add_argument(
        "--last-blocks",
        type=int,
        default=d.last_blocks,
        help="Also train the language model's last N decoder blocks (0: the projector only).",
    )
    parser.add_argument(
        "--window-seconds",
        type=int,
        default=d.window_seconds,
        help="The tower's input window in seconds (Whisper's is 30; FSDD's clips fit in 3).",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="Seed of the new projector and the clip draws.")
    parser.add_argument(
        "--train-splits",
        default=",".join(d.train_splits),
        help="Manifest splits that train the model, comma-separated: train (the original) or "
        "spk_retain_train (the retrained reference of speaker forgetting: no forgotten speaker).",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads.")
    parser.add_argument("--assemble-only", action="store_true", help="Only write the untrained folder and stop.")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    if not 1 <= args.window_seconds <= 30:
        parser.error("--window-seconds must be 1..30 (Whisper's window is 30 s)")
    torch.set_num_threads(args.threads)
    if args.assemble_only:
        path = assembled_dir(window_seconds=args.window_seconds, seed=args.seed)
        print(path)
        return path
    if args.manifests is None:
        parser.error("--manifests is required (unless --assemble-only)")
    settings = PresetTraining(
        tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_train_clips=args.max_train_clips,
        max_test_clips=args.max_test_clips,
        last_blocks=args.last_blocks,
        window_seconds=args.window_seconds,
        seed=args.seed,
        train_splits=tuple(t.strip() for t in args.train_splits.split(",") if t.strip()),
    )
    command = "python -m data_prep.whisper_smollm2 " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    train_preset(args.manifests, args.out, settings, command=command, log=lambda s: print(s, flush=True))
    return args.out


if __name__ == "__main__":  # pragma: no cover
    run_main(main)
