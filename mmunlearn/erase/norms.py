"""Fast norm and finiteness checks on large matrices (no float64 or full-size temporaries)."""

from __future__ import annotations

import math

import torch

from mmunlearn.taskvec.lowrank import LowRank


def sq_norm(T: torch.Tensor) -> float:
    """||T||_F^2 as a Python float (no float64 copy of T; a factored task matrix is not materialised)."""
    if isinstance(T, LowRank):
        return T.sq_norm()
    return float(torch.linalg.vector_norm(T)) ** 2


def col_sq_norms(A: torch.Tensor, block: int = 512) -> torch.Tensor:
    """Squared column norms in float64, reduced over row blocks.

    A strided dim-0 reduction over a C-contiguous matrix is ~12x slower, and ``A * A`` would
    allocate a full-size temporary.
    """
    acc = torch.zeros(A.shape[1], dtype=torch.float64, device=A.device)
    for i in range(0, A.shape[0], block):
        b = A[i : i + block]
        acc += (b * b).sum(0, dtype=torch.float64)
    return acc


def all_finite(T: torch.Tensor) -> bool:
    """Whether every entry is finite. A finite norm proves it at the cost of one reduction;
    only a non-finite norm (NaN/Inf, or float overflow of huge entries) checks entry by entry."""
    if isinstance(T, LowRank):
        return T.is_finite()
    if T.numel() == 0:
        return True
    if math.isfinite(float(torch.linalg.vector_norm(T.detach().float() if not T.is_floating_point() else T.detach()))):
        return True
    return bool(torch.isfinite(T).all())
