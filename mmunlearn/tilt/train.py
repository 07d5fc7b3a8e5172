"""Train the T3 tilt head on cached hidden states (binary cross-entropy, balanced classes).

At each answer position t the head's entry for the true token y_t, read from the state at t-1,
is trained towards the sequence's partition: retain 1, forget 0. Classes are balanced by
weighting each example by N / (2 N_class). With ``unseen_only`` the positions whose token is already in the text
(a copy of the question's words or of the answer so far) are left out: T3's ``spare_seen`` spares those when it
scores and generates, so the head's rank goes to the rest. Training runs through the shared loop (accelerate).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mmunlearn.tilt.cache import StateCache, build_cache
from mmunlearn.tilt.head import TiltHead
from mmunlearn.train import TrainConfig, train


@dataclass
class TiltTraining:
    """A trained head and how it was obtained."""

    head: TiltHead
    cache_seconds: float  # one-off hidden-state extraction (0 when the cache was reused)
    train_seconds: float
    train_accuracy: float  # balanced accuracy of sign(logit) vs partition on the cached tokens
    parameters: int
    fraction: float  # of the base model's parameters
    cache_reused: bool
    final_loss: float

    def summary(self) -> str:
        return (
            f"tilt head: {self.parameters:,} trainable parameters ({100 * self.fraction:.2f}% of the base), "
            f"balanced train accuracy {self.train_accuracy:.3f}, cache {self.cache_seconds:.1f} s"
            f"{' (reused)' if self.cache_reused else ''}, training {self.train_seconds:.1f} s"
        )


def balanced_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean of the per-class accuracies of sign(logit) against 0/1 labels."""
    pred = logits > 0
    pos, neg = labels > 0.5, labels <= 0.5
    return 0.5 * (float(pred[pos].float().mean()) + float((~pred[neg]).float().mean()))


def fit_head(
    cache: StateCache,
    vocab: int,
    rank: int = 20,
    epochs: int = 100,
    lr: float = 1e-2,
    batch_size: int | None = None,
    weight_decay: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    pooling: str = "last",
    unseen_only: bool = False,
    **train_kwargs,
) -> tuple[TiltHead, Any]:
    """Fit a fresh head on a cache (whose states were pooled as ``pooling``); full-batch epochs unless ``batch_size``
    is given; with ``unseen_only`` on the cached positions whose token is not already in the text."""
    kept = training_positions(cache, unseen_only)
    labels = cache.labels[kept]
    n = len(kept)
    n_pos = float(labels.sum())
    if n_pos == 0 or n_pos == n:
        raise ValueError("the cache needs answer tokens of both partitions (retain and forget)")
    weights = torch.where(labels > 0.5, n / (2 * n_pos), n / (2 * (n - n_pos)))
    torch.manual_seed(seed)
    head = TiltHead(cache.states.shape[1], vocab, rank, pooling=pooling)
    torch.nn.init.normal_(head.B.weight, std=0.02)  # a zero B would receive no gradient through A

    def collate(idx: list[int]) -> dict[str, torch.Tensor]:
        i = torch.as_tensor(idx)
        j = kept[i]
        return {"h": cache.states[j], "y": cache.tokens[j], "label": labels[i], "w": weights[i]}

    def loss_fn(model, batch):
        z = model.logit_of(batch["h"], batch["y"])
        return F.binary_cross_entropy_with_logits(z, batch["label"], weight=batch["w"])

    result = train(
        head,
        loss_fn,
        list(range(n)),
        collate,
        TrainConfig(
            epochs=epochs, lr=lr, batch_size=batch_size or n, weight_decay=weight_decay, seed=seed, schedule="constant"
        ),
        progress=progress,
        desc="tilt head",
        **train_kwargs,
    )
    return head.cpu().eval(), result


def training_positions(cache: StateCache, unseen_only: bool = False) -> torch.Tensor:
    """Indices of the cached positions the head trains on: every one, or with ``unseen_only`` those whose token is
    not already in the text before it."""
    if not unseen_only:
        return torch.arange(len(cache.tokens))
    return torch.nonzero(~cache.seen.bool()).flatten()


def train_tilt(
    adapter,
    retain: Sequence[Any],
    forget: Sequence[Any],
    *,
    rank: int = 20,
    epochs: int = 100,
    lr: float = 1e-2,
    cache_dir=None,
    batch_size: int | None = None,
    seed: int = 0,
    progress: bool = True,
    pooling: str = "last",
    unseen_only: bool = False,
) -> TiltTraining:
    """Cache the frozen model's states over retain and forget answers (pooled as ``pooling``), then fit the head (on
    the tokens not already in the text alone with ``unseen_only``)."""
    cache = build_cache(adapter, retain, forget, cache_dir=cache_dir, pooling=pooling)
    vocab = adapter.model.get_output_embeddings().weight.shape[0]
    start = time.perf_counter()
    head, result = fit_head(
        cache,
        vocab,
        rank=rank,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        pooling=pooling,
        unseen_only=unseen_only,
    )
    seconds = time.perf_counter() - start
    kept = training_positions(cache, unseen_only)
    with torch.no_grad():
        acc = balanced_accuracy(head.logit_of(cache.states[kept], cache.tokens[kept]), cache.labels[kept])
    n_head = sum(p.numel() for p in head.parameters())
    n_base = sum(p.numel() for p in adapter.model.parameters())
    head.to(adapter.device)
    return TiltTraining(head, cache.seconds, seconds, acc, n_head, n_head / n_base, cache.reused, result.final_loss)
