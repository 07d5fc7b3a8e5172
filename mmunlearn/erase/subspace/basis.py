"""Orthonormal bases of a task matrix's dominant column space: CPQR, sketched CPQR, SVD.

``column_basis`` is the single entry point; methods live in a small registry so that a new one
adds a function and a row to the parametrised tests.

>>> import torch
>>> T = torch.randn(64, 8) @ torch.randn(8, 48)          # rank 8
>>> b = column_basis(T, rank=4)
>>> b.Q.shape, b.k
(torch.Size([64, 4]), 4)
>>> column_basis(T, energy=1.0 - 1e-6).k                  # all the energy needs all 8 directions
8
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmunlearn.erase.norms import all_finite, sq_norm
from mmunlearn.erase.subspace.cpqr import cpqr_lapack, cpqr_torch, lapack_available, pivots_of_sketch
from mmunlearn.taskvec.lowrank import LowRank


@dataclass
class Basis:
    """Orthonormal basis ``Q`` (m x k) of the dominant column space of a task matrix."""

    Q: torch.Tensor
    k: int
    captured: float  # ||Q^T T||_F^2 / ||T||_F^2, in [0, 1]
    method: str
    pivots: torch.Tensor | None = None  # column indices of T (CPQR methods only)
    seconds: float = 0.0
    coef: torch.Tensor | None = None  # Q^T T (k x n), a by-product every method gets for free


@dataclass
class _Found:
    """What a registered method returns: basis, pivots, cumulative energy, Q^T T."""

    Q: torch.Tensor
    pivots: torch.Tensor | None
    cum: torch.Tensor
    coef: torch.Tensor

    def first(self, k: int) -> _Found:
        return _Found(self.Q[:, :k], None if self.pivots is None else self.pivots[:k], self.cum[:k], self.coef[:k])


# A method maps (T, rank, energy, total, seed, oversample) to a _Found; exactly one of
# rank / energy is set and total = ||T||_F^2.
BasisFn = Callable[..., _Found]
METHODS: dict[str, BasisFn] = {}


def register(name: str) -> Callable[[BasisFn], BasisFn]:
    """Add a subspace method to the registry under ``name``."""

    def deco(fn: BasisFn) -> BasisFn:
        METHODS[name] = fn
        return fn

    return deco


def _k_for_energy(cum: torch.Tensor, total: float, energy: float) -> int | None:
    """Smallest k with cum[k-1] >= energy * total, or None if not reached."""
    hits = (cum >= energy * total * (1 - 1e-12)).nonzero()
    return int(hits[0]) + 1 if len(hits) else None


def _grow(fn: Callable[[int], _Found], T: torch.Tensor, rank, energy, total) -> _Found:
    """Run ``fn(k)`` for k = rank, or double k from 64 until the energy target is met."""
    if rank is not None:
        return fn(rank)
    k = min(64, *T.shape)
    while True:
        found = fn(k)
        kk = _k_for_energy(found.cum, total, energy)
        if kk is not None or k >= min(T.shape):
            return found.first(kk or len(found.cum))
        k = min(2 * k, *T.shape)


@register("cpqr-lapack")
def _cpqr_lapack(T, rank, energy, total, seed, oversample):
    """Truncated CPQR with LAPACK ?geqp3rk (CPU)."""

    def run(k):
        r = cpqr_lapack(T, k)
        return _Found(r.Q, r.pivots, r.cum_energy, r.coef)

    return _grow(run, T, rank, energy, total)


@register("cpqr-torch")
def _cpqr_torch(T, rank, energy, total, seed, oversample):
    """Left-looking truncated CPQR in torch (any device); stops on the energy target itself."""
    r = cpqr_torch(T, rank if rank is not None else min(T.shape), tau=energy)
    return _Found(r.Q, r.pivots, r.cum_energy, r.coef)


#: Up to this many pivots the left-looking torch path (one memory-bound GEMV per pivot) beats
#: LAPACK's blocked ?geqp3rk on CPU, which pays a column-major copy and a trailing update.
TORCH_MAX_PIVOTS = 96


@register("cpqr")
def _cpqr(T, rank, energy, total, seed, oversample):
    """Exact truncated CPQR: the torch path for small k or off the CPU, LAPACK for large k on CPU."""
    small = rank is not None and rank <= TORCH_MAX_PIVOTS
    if T.device.type == "cpu" and lapack_available() and not small:
        return _cpqr_lapack(T, rank, energy, total, seed, oversample)
    return _cpqr_torch(T, rank, energy, total, seed, oversample)


@register("cpqr-sketch")
def _cpqr_sketch(T, rank, energy, total, seed, oversample):
    """Gaussian row sketch (l = k + p rows), CPQR of the sketch picks columns, QR of those."""
    m = T.shape[0]
    gen = torch.Generator(device=T.device).manual_seed(seed)

    def run(k):
        omega = torch.randn(min(k + oversample, m), m, generator=gen, device=T.device, dtype=T.dtype)
        cols = pivots_of_sketch(omega @ T, k).to(T.device)
        Q, _ = torch.linalg.qr(T[:, cols])
        coef = Q.T @ T
        return _Found(Q, cols, torch.cumsum((coef * coef).sum(1, dtype=torch.float64), 0), coef)

    return _grow(run, T, rank, energy, total)


def _from_svd(U, S, Vh, rank, energy, total) -> _Found:
    found = _Found(U, None, torch.cumsum(S.double() ** 2, 0), S[:, None] * Vh)
    k = rank if rank is not None else (_k_for_energy(found.cum, total, energy) or len(S))
    return found.first(k)


@register("svd")
def _svd(T, rank, energy, total, seed, oversample):
    """Full thin SVD: the UNLEARN baseline."""
    U, S, Vh = torch.linalg.svd(T, full_matrices=False)
    return _from_svd(U, S, Vh, rank, energy, total)


@register("svd-lowrank")
def _svd_lowrank(T, rank, energy, total, seed, oversample):
    """Randomised SVD (torch.svd_lowrank, q = k + p, two power iterations)."""
    torch.manual_seed(seed)  # svd_lowrank draws from the global generator

    def run(k):
        U, S, V = torch.svd_lowrank(T, q=min(k + oversample, *T.shape), niter=2)
        return _from_svd(U, S, V.T, k, None, total)

    if rank is not None:
        return run(rank)
    return _grow(run, T, None, energy, total)


def _validate(T: torch.Tensor, rank: int | None, energy: float | None, method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown subspace method {method!r}; choose one of {sorted(METHODS)}")
    if not isinstance(T, torch.Tensor) or T.dim() != 2:
        shape = tuple(T.shape) if isinstance(T, torch.Tensor) else type(T).__name__
        raise ValueError(f"task matrix must be a 2-D tensor, got {shape}")
    if min(T.shape) == 0:
        raise ValueError(f"task matrix is empty: shape {tuple(T.shape)}")
    if (rank is None) == (energy is None):
        raise ValueError("give exactly one of rank=k or energy=tau")
    if rank is not None and not (isinstance(rank, int) and 1 <= rank <= min(T.shape)):
        raise ValueError(f"rank must be an integer in [1, {min(T.shape)}] for shape {tuple(T.shape)}, got {rank!r}")
    if energy is not None and not (0.0 < float(energy) <= 1.0):
        raise ValueError(f"energy must be in (0, 1], got {energy!r}")


def column_basis(
    T: torch.Tensor,
    rank: int | None = None,
    energy: float | None = None,
    method: str = "cpqr",
    *,
    seed: int = 0,
    oversample: int = 10,
) -> Basis:
    """Orthonormal basis of the dominant column space of ``T`` (m x n).

    Args:
        T: task matrix (any float dtype; computed in float32, or float64 if given).
        rank: number of directions k.
        energy: instead of ``rank``, the smallest k with ``||Q^T T||_F^2 >= energy * ||T||_F^2``.
        method: one of ``METHODS``: ``cpqr`` (truncated CPQR, LAPACK on CPU), ``cpqr-lapack``,
            ``cpqr-torch``, ``cpqr-sketch``, ``svd`` (UNLEARN baseline), ``svd-lowrank``.
        seed: seed of the random sketch (``cpqr-sketch``, ``svd-lowrank``).
        oversample: extra sketch rows / randomised-SVD columns p.

    Directions with (numerically) zero energy are dropped, so ``k`` can be below ``rank`` when
    ``T`` has lower rank. ``T`` may be a :class:`~mmunlearn.taskvec.lowrank.LowRank` (B @ A, e.g. a
    LoRA update): then it is never materialised (see :func:`_lowrank_basis`).
    """
    if isinstance(T, LowRank):
        return _lowrank_basis(T, rank, energy, method, seed, oversample)
    _validate(T, rank, energy, method)
    work = T.detach()
    work = work if work.dtype in (torch.float32, torch.float64) else work.float()
    start = time.perf_counter()
    total = sq_norm(work)
    if not math.isfinite(total) and not all_finite(work):  # one reduction proves finiteness
        raise ValueError("task matrix contains NaN or Inf values")
    if not math.isfinite(total):
        work = work.double()  # finite entries whose squares overflow float32
        total = sq_norm(work)
    if total == 0.0:
        Q = torch.zeros(work.shape[0], 0, dtype=work.dtype, device=work.device)
        return Basis(Q=Q, k=0, captured=1.0, method=method, coef=work.new_zeros(0, work.shape[1]))
    found = METHODS[method](work, rank, energy, total, seed, oversample)
    # Drop trailing directions that add no energy (T of lower rank than asked).
    gains = torch.diff(found.cum, prepend=found.cum.new_zeros(1))
    live = (gains > total * torch.finfo(work.dtype).eps * 10).nonzero()
    found = found.first(min(int(live[-1]) + 1 if len(live) else 0, found.Q.shape[1]))
    k = found.Q.shape[1]
    return Basis(
        Q=found.Q.to(work.device),
        k=k,
        captured=min(float(found.cum[-1]) / total, 1.0) if k else 0.0,
        method=method,
        pivots=found.pivots,
        seconds=time.perf_counter() - start,
        coef=found.coef.to(work.device),
    )


def _lowrank_basis(
    T: LowRank, rank: int | None, energy: float | None, method: str, seed: int, oversample: int
) -> Basis:
    """Basis of a factored T = B A from B alone: with Q_B an orthonormal basis of range(B) (thin QR,
    m x r), T = Q_B C where C = (Q_B^T B) A is only r x n; the method runs on C, and Q = Q_B Q_C.
    Since Q_B is orthonormal, ||C||_F = ||T||_F and Q^T T = Q_C^T C: energies, ranks and coefficients
    are those of T itself, at O((m + n) r^2) cost instead of the m x n matrix."""
    if method not in METHODS:
        raise ValueError(f"unknown subspace method {method!r}; choose one of {sorted(METHODS)}")
    if (rank is None) == (energy is None):
        raise ValueError("give exactly one of rank=k or energy=tau")
    if rank is not None and not (isinstance(rank, int) and 1 <= rank <= min(T.shape)):
        raise ValueError(f"rank must be an integer in [1, {min(T.shape)}] for shape {tuple(T.shape)}, got {rank!r}")
    if not T.is_finite():
        raise ValueError("task matrix contains NaN or Inf values")
    start = time.perf_counter()
    B = T.B.detach()
    B = B if B.dtype in (torch.float32, torch.float64) else B.float()
    Q_B, R = torch.linalg.qr(B)
    C = R @ T.A.detach().to(B.dtype)
    inner = column_basis(
        C,
        rank=None if rank is None else min(rank, min(C.shape)),
        energy=energy,
        method=method,
        seed=seed,
        oversample=oversample,
    )
    return Basis(
        Q=Q_B @ inner.Q,
        k=inner.k,
        captured=inner.captured,
        method=method,
        pivots=None,
        seconds=time.perf_counter() - start,
        coef=inner.coef,
    )
