"""Probing attack: can a linear read-out of the hidden states still tell the forgotten data apart?

Text (Lynch et al. 2024 use probes the same way): answers of the forget authors against answers of TOFU's
never-seen holdout authors, each answer represented by the mean hidden state over its answer tokens at every
layer; a logistic-regression probe is trained and tested by stratified k-fold cross-validation on each model's
own states, and the probe trained on the target's states is also applied to the model's states
(``transfer``). The retain model never saw either set, so its accuracy is what the content difference of
the two sets alone gives; the target's is what memorisation adds.

Speaker classifiers (verification-level forgetting): embeddings of held-out recordings (never trained on)
are identified by the nearest speaker centroid (cosine), the centroids made from the first half of each
speaker's held-out recordings. A classifier whose output layer no longer names a forgotten speaker may still
embed that speaker's voice where a verification system finds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmunlearn.adapters.base import IGNORE


def _standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mu, sd = train.mean(0), train.std(0).clamp(min=1e-6)
    return [(x - mu) / sd for x in (train, *others)]


def fit_logistic(
    x: torch.Tensor, y: torch.Tensor, l2: float = 1e-1, steps: int = 100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary logistic regression (weights, bias) fitted by L-BFGS with an L2 penalty on the weights."""
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")
    target = y.double()

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, target) + l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def folds(labels: np.ndarray, k: int, seed: int = 0) -> list[np.ndarray]:
    """Stratified folds: each class's indices shuffled (seeded) and dealt round-robin into ``k`` folds."""
    rng = np.random.default_rng(seed)
    out: list[list[int]] = [[] for _ in range(k)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        for j, i in enumerate(idx):
            out[j % k].append(int(i))
    return [np.array(sorted(f), dtype=int) for f in out if f]


def probe_accuracy(
    features: np.ndarray | torch.Tensor, labels: np.ndarray | Sequence[int], k: int = 5, seed: int = 0
) -> float:
    """Cross-validated accuracy of a linear probe predicting the binary ``labels`` from ``features`` (N x d)."""
    x = torch.as_tensor(np.asarray(features), dtype=torch.float64)
    y = np.asarray(labels).astype(int)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"features must be N x d with one label per row, got {tuple(x.shape)} and {len(y)} labels")
    if set(np.unique(y)) != {0, 1}:
        raise ValueError("probe_accuracy needs binary labels with both classes present")
    correct = 0
    for test in folds(y, k, seed):
        train = np.setdiff1d(np.arange(len(y)), test)
        xtr, xte = _standardise(x[train], x[test])
        w, b = fit_logistic(xtr, torch.as_tensor(y[train]))
        correct += int(((xte @ w + b > 0).numpy().astype(int) == y[test]).sum())
    return correct / len(y)


def transfer_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
    """Accuracy on (test_x, test_y) of a probe fitted on all of (train_x, train_y) (standardised by the train set)."""
    xtr, xte = _standardise(torch.as_tensor(train_x, dtype=torch.float64), torch.as_tensor(test_x, dtype=torch.float64))
    w, b = fit_logistic(xtr, torch.as_tensor(np.asarray(train_y)))
    return float(((xte @ w + b > 0).numpy().astype(int) == np.asarray(test_y)).mean())


@torch.no_grad()
def answer_states(adapter: Any, items: Sequence[Any], batch_size: int = 16) -> np.ndarray:
    """Mean hidden state over each item's answer tokens at every layer of a causal LM: L x N x d
    (layer 0: the embeddings, as HF's ``hidden_states`` tuple)."""
    per_layer: list[list[torch.Tensor]] | None = None
    for i in range(0, len(items), batch_size):
        batch = adapter.collate(items[i : i + batch_size])
        dev = adapter.device
        out = adapter.model(
            input_ids=batch["input_ids"].to(dev),
            attention_mask=batch["attention_mask"].to(dev),
            output_hidden_states=True,
        )
        mask = (batch["labels"] != IGNORE).to(dev).unsqueeze(-1).float()
        pooled = [((h.float() * mask).sum(1) / mask.sum(1).clamp(min=1)).cpu() for h in out.hidden_states]
        per_layer = [[p] for p in pooled] if per_layer is None else [acc + [p] for acc, p in zip(per_layer, pooled)]
    return np.stack([torch.cat(chunks).double().numpy() for chunks in per_layer])


def text_probe(
    states: Mapping[str, np.ndarray],
    n_forget: int,
    n_holdout: int,
    *,
    k: int = 5,
    seed: int = 0,
    reference: str = "target",
) -> dict[str, dict[str, Any]]:
    """Per model (name -> L x N x d states of forget items then holdout items): the probe's cross-validated
    accuracy at every layer, the best layer's, and the accuracy of the ``reference`` model's probe (fitted at
    that model's best layer) on this model's states at the same layer."""
    labels = np.array([1] * n_forget + [0] * n_holdout)
    out: dict[str, dict[str, Any]] = {}
    for name, s in states.items():
        if s.shape[1] != len(labels):
            raise ValueError(f"{name}: {s.shape[1]} states for {len(labels)} items")
        per_layer = [probe_accuracy(s[layer], labels, k, seed) for layer in range(s.shape[0])]
        out[name] = {
            "accuracy_by_layer": per_layer,
            "accuracy": max(per_layer),
            "best_layer": int(np.argmax(per_layer)),
        }
    if reference in states:
        layer = out[reference]["best_layer"]
        ref = states[reference][layer]
        for name, s in states.items():
            out[name]["transfer_accuracy"] = transfer_accuracy(ref, labels, s[layer], labels)
    return out


def nearest_centroid_accuracy(
    embeddings: np.ndarray, speakers: Sequence[str], *, only: Sequence[str] | None = None
) -> float | None:
    """Speaker identification of held-out recordings by the nearest centroid (cosine): per speaker the first
    half (at least one) of its recordings make the centroid, the rest are identified among all speakers.
    Accuracy over the test recordings of the speakers in ``only`` (default: all); None when they have none."""
    emb = np.asarray(embeddings, dtype=np.float64)
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True).clip(min=1e-12)
    by_spk: dict[str, list[int]] = {}
    for i, s in enumerate(speakers):
        by_spk.setdefault(str(s), []).append(i)
    names = sorted(by_spk)
    centroids, tests = [], []
    for s in names:
        idx = by_spk[s]
        enrol = idx[: max(1, len(idx) // 2)]
        c = emb[enrol].mean(0)
        centroids.append(c / max(np.linalg.norm(c), 1e-12))
        tests += [(i, s) for i in idx[len(enrol) :]]
    keep = set(map(str, only)) if only is not None else set(names)
    tests = [(i, s) for i, s in tests if s in keep]
    if not tests:
        return None
    sims = emb[[i for i, _ in tests]] @ np.stack(centroids).T
    guesses = [names[j] for j in sims.argmax(1)]
    return float(np.mean([g == s for g, (_, s) in zip(guesses, tests)]))
