"""QR-Erase's optional embedding step for speaker classifiers (``EraseConfig.centroid``): the forgotten speakers'
centroid directions outside the retained speakers' span, erased from the layer whose outputs are the embeddings.

The edit is :func:`mmunlearn.erase.subspace.centroid.project_output` (``W <- (I - a U U^T) W``, the bias likewise) on
the layer
the adapter names in ``embedding_output`` (ECAPA's last 1x1 convolution, a Hugging Face classifier's projector: the
head reads a time average of its outputs, which the edit commits with). Retained speakers' mean embeddings do not move;
``a = 1`` leaves the forgotten ones no component along ``U``, ``a = 2`` reflects it. On its own it does not make a
classifier forget; after the head edit it makes the forgetting harder to relearn (docs/speakers.md, issue 24 item 4).
The step returns dense undo records, which join the erasure's patch, so ``mmunlearn restore`` and the harness's
in-memory undo give the input back bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mmunlearn.erase.patch import PatchEntry, dense_entry
from mmunlearn.erase.subspace.centroid import centroid_subspace, class_centroids, project_output


@torch.no_grad()
def _embeddings(adapter, rows: Sequence[Any], batch_size: int = 16) -> tuple[torch.Tensor, list[str]]:
    model = adapter.model
    was_training = model.training
    model.eval()
    parts = []
    try:
        for i in range(0, len(rows), batch_size):
            parts.append(adapter.embeddings(adapter.collate(rows[i : i + batch_size])).double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(parts), [str(r["spk_id"]) for r in rows]


def erase_centroids(
    adapter, forget: Sequence[Any], retain: Sequence[Any], alpha: float
) -> tuple[list[PatchEntry], dict[str, Any]]:
    """Apply the embedding step to ``adapter.model`` in place; its undo records and facts (directions erased, the
    retained centroids' largest relative move). Centroids are taken from ``forget`` and ``retain`` before the edit."""
    if not alpha > 0:
        raise ValueError(f"centroid must be > 0 to erase anything, got {alpha}")
    names = adapter.embedding_output  # a ClassifierAdapter's (the erasure calls this for classifier kinds only)
    if names is None:
        raise ValueError(
            f"{type(adapter).__name__} does not name the layer that outputs its embeddings "
            "(embedding_output): the centroid step needs a speaker classifier"
        )
    if not forget or not retain:
        raise ValueError("the centroid step needs forget and retain utterances")
    params = dict(adapter.model.named_parameters())
    missing = [n for n in names if n is not None and n not in params]
    if missing:
        raise ValueError(f"embedding_output names {missing}, which the model does not hold")
    emb_f, spk_f = _embeddings(adapter, forget)
    emb_r, spk_r = _embeddings(adapter, retain)
    kept = class_centroids(emb_r, spk_r)
    basis = centroid_subspace(class_centroids(emb_f, spk_f), {k: v for k, v in kept.items() if k not in set(spk_f)})
    weight = params[names[0]]
    bias = params[names[1]] if names[1] is not None else None
    before = {n: params[n].detach().clone() for n in names if n is not None}
    project_output(weight.data, None if bias is None else bias.data, basis, float(alpha))
    entries = [dense_entry(n, before[n], params[n].detach()) for n in before]
    after, _ = _embeddings(adapter, retain)
    moved = class_centroids(after, spk_r)
    shift = max(float(np.linalg.norm(moved[k] - v) / max(float(np.linalg.norm(v)), 1e-12)) for k, v in kept.items())
    return entries, {
        "alpha": float(alpha),
        "directions": int(basis.shape[1]),
        "layer": names[0],
        "retain_centroid_max_rel_change": shift,
    }
