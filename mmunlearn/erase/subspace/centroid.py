"""Centroid erasure of an embedding layer: remove (or reflect) the forgotten classes' mean-embedding directions that lie
outside the span of the kept classes' mean embeddings, from a linear layer whose outputs are the embeddings.

For a last layer ``e = W z + b`` (a Linear, or a 1x1 Conv1d: weight ``d x in`` or ``d x in x 1``), with ``U`` an
orthonormal basis of the forgotten centroids projected off the kept centroids' span (:func:`centroid_subspace`), the
edit ``W <- (I - alpha U U^T) W``, ``b <- (I - alpha U U^T) b`` (:func:`project_output`) leaves every kept class's mean
embedding unchanged (``U`` is orthogonal to it) and, with ``alpha = 1``, leaves the forgotten classes' mean embeddings
no component along ``U``; ``alpha = 2`` reflects that component. Measured on a speaker classifier in
``docs/speakers.md`` (issue 24, item 4): it does not make the classifier forget on its own; after a head edit it makes
the forgetting harder to relearn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def class_centroids(embeddings: np.ndarray | torch.Tensor, labels: Sequence[object]) -> dict[str, np.ndarray]:
    """Mean embedding of each label (N x d embeddings, N labels), keyed by ``str(label)``."""
    emb = np.asarray(embeddings, dtype=np.float64)
    lab = np.array([str(x) for x in labels])
    if emb.ndim != 2 or len(emb) != len(lab) or len(lab) == 0:
        raise ValueError(f"embeddings must be N x d with one label per row, got {emb.shape} and {len(lab)} labels")
    return {k: emb[lab == k].mean(0) for k in sorted(set(lab))}


def centroid_subspace(forget: dict[str, np.ndarray], keep: dict[str, np.ndarray], tol: float = 1e-6) -> torch.Tensor:
    """Orthonormal basis (d x k, float64) of the forgotten centroids projected off the span of the kept centroids;
    directions with a singular value below ``tol`` times the largest are dropped (k may be 0)."""
    if not forget or not keep:
        raise ValueError("centroid_subspace needs at least one forgotten and one kept centroid")
    shared = set(forget) & set(keep)
    if shared:
        raise ValueError(f"classes both forgotten and kept: {sorted(shared)[:5]}")
    kept = np.stack([keep[k] for k in sorted(keep)], 1)
    gone = np.stack([forget[k] for k in sorted(forget)], 1)
    if kept.shape[0] != gone.shape[0]:
        raise ValueError(f"centroid dimensions differ: {gone.shape[0]} and {kept.shape[0]}")
    q, _ = np.linalg.qr(kept)
    outside = gone - q @ (q.T @ gone)
    u, s, _ = np.linalg.svd(outside, full_matrices=False)
    if s.size == 0 or s.max() <= 0:
        return torch.zeros(gone.shape[0], 0, dtype=torch.float64)
    return torch.from_numpy(np.ascontiguousarray(u[:, s > tol * s.max()]))


@torch.no_grad()
def project_output(weight: torch.Tensor, bias: torch.Tensor | None, basis: torch.Tensor, alpha: float = 1.0) -> None:
    """In place: ``weight <- (I - alpha U U^T) weight`` along its output dimension (dim 0; any trailing kernel
    dimensions kept), the same for ``bias``; computed in float64, stored in the tensors' dtypes."""
    if basis.ndim != 2 or basis.shape[0] != weight.shape[0]:
        raise ValueError(
            f"basis must be {weight.shape[0]} x k for a weight with {weight.shape[0]} outputs, got {tuple(basis.shape)}"
        )
    if not (0.0 <= alpha <= 2.0):
        raise ValueError(f"alpha must be in [0, 2] (1 removes the directions, 2 reflects them), got {alpha}")
    u = basis.to(torch.float64)
    proj = torch.eye(u.shape[0], dtype=torch.float64) - alpha * (u @ u.T)
    w = weight.detach().to(torch.float64).reshape(weight.shape[0], -1)
    weight.copy_((proj @ w).reshape(weight.shape).to(weight.dtype))
    if bias is not None:
        bias.copy_((proj @ bias.detach().to(torch.float64)).to(bias.dtype))


__all__ = ["centroid_subspace", "class_centroids", "project_output"]
