"""Retain discrimination: keep only the part of the forget subspace the retain task does not use.

T~ = (I - Q_r Q_r^T) Q_f Q_f^T T_f, optionally also with the retain row space removed:
T~ = (I - Q_r Q_r^T) Q_f Q_f^T T_f (I - P_r P_r^T). It is kept as low-rank factors A (m x k) and
B (k x n) with T~ = A B, which is what the undo patch stores.

>>> import torch
>>> Qf = torch.linalg.qr(torch.randn(32, 4))[0]; Qr = torch.linalg.qr(torch.randn(32, 6))[0]
>>> Tf = torch.randn(32, 20)
>>> A, B = discriminate_factors(Qf, Tf, Qr)
>>> A.shape, B.shape
(torch.Size([32, 4]), torch.Size([4, 20]))
>>> bool((Qr.T @ (A @ B)).abs().max() < 1e-5)
True
"""

from __future__ import annotations

import torch

from mmunlearn.erase.norms import all_finite


def _check_basis(name: str, Q: torch.Tensor | None, dim: int, side: str) -> None:
    if Q is None:
        return
    if Q.dim() != 2 or Q.shape[0] != dim:
        raise ValueError(f"{name} must have {dim} rows to match the task matrix's {side}, got {tuple(Q.shape)}")
    if not all_finite(Q):
        raise ValueError(f"{name} contains NaN or Inf values")


def discriminate_factors(
    Q_f: torch.Tensor,
    T_f: torch.Tensor,
    Q_r: torch.Tensor | None = None,
    P_r: torch.Tensor | None = None,
    *,
    coef: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Low-rank factors (A, B) of the retain-discriminated forget update, T~ = A @ B.

    Args:
        Q_f: orthonormal forget column basis, m x k.
        T_f: forget task matrix, m x n.
        Q_r: orthonormal retain column basis, m x k_r (None: no column discrimination).
        P_r: orthonormal retain row basis, n x k_r' (None: rows left as they are).
        coef: Q_f^T T_f if already known (``Basis.coef``), saving one product with T_f.
    """
    if T_f.dim() != 2:
        raise ValueError(f"T_f must be 2-D, got shape {tuple(T_f.shape)}")
    m, n = T_f.shape
    _check_basis("Q_f", Q_f, m, "rows")
    _check_basis("Q_r", Q_r, m, "rows")
    _check_basis("P_r", P_r, n, "columns")
    dtype = torch.promote_types(Q_f.dtype, T_f.dtype)
    Q_f, T_f = Q_f.to(dtype), T_f.to(dtype)
    A = Q_f
    if Q_r is not None and Q_r.shape[1] > 0:
        Q_r = Q_r.to(dtype)
        A = Q_f - Q_r @ (Q_r.T @ Q_f)
    if coef is not None and coef.shape != (Q_f.shape[1], n):
        raise ValueError(f"coef must be Q_f^T T_f of shape {(Q_f.shape[1], n)}, got {tuple(coef.shape)}")
    B = coef.to(dtype) if coef is not None else Q_f.T @ T_f
    if P_r is not None and P_r.shape[1] > 0:
        P_r = P_r.to(dtype)
        B = B - (B @ P_r) @ P_r.T
    return A, B


def discriminate(
    Q_f: torch.Tensor,
    T_f: torch.Tensor,
    Q_r: torch.Tensor | None = None,
    P_r: torch.Tensor | None = None,
) -> torch.Tensor:
    """T~ = (I - Q_r Q_r^T) Q_f Q_f^T T_f [(I - P_r P_r^T)], the update QR-Erase subtracts.

    Property: ``Q_r.T @ T~`` is zero up to rounding (and ``T~ @ P_r`` too when P_r is given).
    """
    A, B = discriminate_factors(Q_f, T_f, Q_r, P_r)
    return A @ B
