"""Truncated column-pivoted QR: LAPACK ``?geqp3rk`` through ctypes, and a portable torch path.

Both stop after ``k`` pivots (or once the captured energy reaches a fraction ``tau``) instead of
factorising the whole matrix. They return the pivots, the orthonormal basis ``Q`` (m x k) of the
chosen columns, and the cumulative captured energy ``||Q_j^T T||_F^2`` for j = 1..k.

Why hand-written: scipy wraps only the full ``?geqp3``; its bundled OpenBLAS exports the truncated
``?geqp3rk`` (LAPACK >= 3.12) without a Python binding, and PyTorch has no pivoted QR at all.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmunlearn.erase.norms import col_sq_norms


@dataclass
class PivotedQR:
    """Result of a truncated pivoted QR of T (m x n)."""

    Q: torch.Tensor  # m x k, orthonormal columns spanning T[:, pivots]
    pivots: torch.Tensor  # k column indices of T, in pivot order
    cum_energy: torch.Tensor  # k values: ||Q[:, :j]^T T||_F^2 for j = 1..k (float64)
    coef: torch.Tensor  # k x n, Q^T T (the rows of R, in T's column order)


# ---------------------------------------------------------------------------------------------
# LAPACK ?geqp3rk from scipy's bundled OpenBLAS
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _lapack_lib() -> ctypes.CDLL | None:
    """The OpenBLAS that scipy ships, if it exports ``?geqp3rk``; ``None`` otherwise."""
    import scipy

    libs = Path(scipy.__file__).parent.parent / "scipy.libs"
    for path in sorted(libs.glob("libscipy_openblas*.so*")) + sorted(libs.glob("libopenblas*.so*")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for prefix in ("scipy_", ""):
            if hasattr(lib, f"{prefix}sgeqp3rk_") and hasattr(lib, f"{prefix}dgeqp3rk_"):
                lib._mm_prefix = prefix  # type: ignore[attr-defined]
                return lib
    return None


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """threadpoolctl's view of the BLAS libraries loaded so far (scipy's OpenBLAS among them, once
    :func:`_lapack_lib` has run), made once: a limit then costs microseconds instead of a library scan."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def blas_threads():
    """A context in which the BLAS libraries use as many threads as torch does (``torch.get_num_threads()``: the
    toolkit's ``threads`` setting). OpenBLAS otherwise starts a thread per core whatever torch was told, and its
    pivoted QR, a sequence of small matrix-vector steps, spends that time waiting: on a 2-core host running two
    one-thread processes, rank-128 CPQRs of SmolLM2-sized matrices took 95x the wall time of one thread."""
    return _blas_controller().limit(limits=torch.get_num_threads(), user_api="blas")


def lapack_available() -> bool:
    """Whether the truncated LAPACK CPQR (``?geqp3rk``) can be called on this machine."""
    return _lapack_lib() is not None


def _geqp3rk(a: np.ndarray, kmax: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Call ``?geqp3rk`` in place on a Fortran-ordered array. Returns (k, 0-based pivots, tau)."""
    lib = _lapack_lib()
    if lib is None:
        raise RuntimeError("LAPACK ?geqp3rk is not available (scipy's OpenBLAS lacks it)")
    m, n = a.shape
    if a.dtype == np.float32:
        fn, real, np_real = getattr(lib, f"{lib._mm_prefix}sgeqp3rk_"), ctypes.c_float, np.float32
    elif a.dtype == np.float64:
        fn, real, np_real = getattr(lib, f"{lib._mm_prefix}dgeqp3rk_"), ctypes.c_double, np.float64
    else:
        raise TypeError(f"geqp3rk needs float32 or float64, got {a.dtype}")
    i = ctypes.c_int
    ref = ctypes.byref
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    jpiv = np.zeros(n, dtype=np.int32)
    tau = np.zeros(min(m, n), dtype=np_real)
    iwork = np.zeros(max(n - 1, 1), dtype=np.int32)
    k_out, info = i(0), i(0)
    maxc2, relmaxc2 = real(0), real(0)
    # Negative tolerances switch those stopping criteria off: we stop on kmax only.
    args_head = (ref(i(m)), ref(i(n)), ref(i(0)), ref(i(kmax)), ref(real(-1.0)), ref(real(-1.0)))
    work_query = np.zeros(1, dtype=np_real)
    fn(
        *args_head,
        ptr(a),
        ref(i(m)),
        ref(k_out),
        ref(maxc2),
        ref(relmaxc2),
        ptr(jpiv),
        ptr(tau),
        ptr(work_query),
        ref(i(-1)),
        ptr(iwork),
        ref(info),
    )
    if info.value != 0:
        raise RuntimeError(f"?geqp3rk workspace query failed (info={info.value})")
    lwork = max(int(work_query[0]), 3 * n)
    work = np.zeros(lwork, dtype=np_real)
    fn(
        *args_head,
        ptr(a),
        ref(i(m)),
        ref(k_out),
        ref(maxc2),
        ref(relmaxc2),
        ptr(jpiv),
        ptr(tau),
        ptr(work),
        ref(i(lwork)),
        ptr(iwork),
        ref(info),
    )
    if info.value < 0:
        raise RuntimeError(f"?geqp3rk rejected argument {-info.value}")
    return k_out.value, jpiv.astype(np.int64) - 1, tau


def cpqr_lapack(T: torch.Tensor, kmax: int) -> PivotedQR:
    """Truncated CPQR of T with LAPACK ``?geqp3rk`` (CPU). Stops after ``kmax`` pivots."""
    from scipy.linalg import lapack

    work = torch.float64 if T.dtype == torch.float64 else torch.float32
    # A Fortran-ordered copy (LAPACK is column-major and overwrites its input). torch's blocked
    # transpose copy is ~7x faster than numpy's order="F" conversion at 4096 x 4096.
    src = T.detach().to("cpu", work)
    a = src.t().clone(memory_format=torch.contiguous_format).numpy().T
    if np.shares_memory(a, src.numpy()):
        a = a.copy(order="F")
    dtype = a.dtype
    m, n = a.shape
    _lapack_lib()  # loaded before the thread limit looks for it
    with blas_threads():
        k, piv, tau = _geqp3rk(a, kmax)
        # Rows of R carry the captured energy: ||Q_j^T T||^2 = sum_{i<j} ||R[i, i:]||^2.
        row_energy = np.array([np.dot(a[i, i:], a[i, i:]) for i in range(k)], dtype=np.float64)
        # Q^T T = R P^T: the upper-trapezoidal first k rows of R, columns put back in T's order.
        coef = np.triu(a[:k, :])
        coef_t = torch.empty(k, n, dtype=work)
        coef_t[:, torch.from_numpy(piv.copy())] = torch.from_numpy(np.ascontiguousarray(coef))
        orgqr = lapack.dorgqr if dtype == np.float64 else lapack.sorgqr
        q, _, info = orgqr(a[:, :k], tau[:k])
    if info != 0:
        raise RuntimeError(f"?orgqr failed (info={info})")
    return PivotedQR(
        Q=torch.from_numpy(np.ascontiguousarray(q)),
        pivots=torch.from_numpy(piv[:k].copy()),
        cum_energy=torch.from_numpy(np.cumsum(row_energy)),
        coef=coef_t,
    )


# ---------------------------------------------------------------------------------------------
# Portable left-looking truncated CPQR (any torch device)
# ---------------------------------------------------------------------------------------------


def cpqr_torch(T: torch.Tensor, kmax: int, tau: float | None = None) -> PivotedQR:
    """Left-looking truncated CPQR in torch: one GEMV with T per pivot, runs on any device.

    Stops after ``kmax`` pivots, when the residual vanishes, or (if ``tau`` is given) as soon as
    the captured energy reaches ``tau * ||T||_F^2``. Column norms are downdated after each pivot
    and recomputed exactly for columns whose downdate lost precision (as LAPACK does).
    """
    m, n = T.shape
    kmax = min(kmax, m, n)
    work = torch.float64 if T.dtype == torch.float64 else torch.float32
    A = T.to(work)
    orig = col_sq_norms(A)
    norms = orig.clone()
    ref = orig.clone()  # norms at their last exact computation (the downdating reference)
    total = float(orig.sum())
    floor = (torch.finfo(work).eps * max(m, n)) ** 2 * float(orig.max())
    stale_tol = torch.finfo(work).eps ** 0.5
    Qt = torch.zeros(kmax, m, dtype=work, device=A.device)  # basis stored as rows
    R = torch.zeros(kmax, n, dtype=work, device=A.device)
    pivots: list[int] = []
    energies: list[float] = []
    captured = 0.0
    for j in range(kmax):
        p = int(torch.argmax(norms))
        if float(norms[p]) <= floor:
            break  # residual is numerically zero: T has rank j
        Qj = Qt[:j]
        col = A[:, p] - R[:j, p] @ Qj
        col = col - (Qj @ col) @ Qj  # second Gram-Schmidt pass keeps Q orthonormal
        nrm = torch.linalg.vector_norm(col)
        if float(nrm) == 0.0:
            break
        Qt[j] = col / nrm
        R[j] = Qt[j] @ A  # the one pass over T per pivot
        pivots.append(p)
        row = R[j].to(torch.float64)
        captured += float(row @ row)
        energies.append(captured)
        norms -= row * row
        norms[p] = -1.0  # taken
        # Downdating loses digits when a column's residual is tiny against its original norm:
        # recompute those columns exactly from T and the current basis.
        stale = (norms >= 0) & (norms <= stale_tol * ref)
        if bool(stale.any()):
            idx = stale.nonzero().squeeze(1)
            res = A[:, idx] - Qt[: j + 1].T @ (Qt[: j + 1] @ A[:, idx])
            norms[idx] = (res * res).sum(0).to(torch.float64)
            ref[idx] = norms[idx]
        if tau is not None and captured >= tau * total:
            break
    k = len(pivots)
    return PivotedQR(
        Q=Qt[:k].T.contiguous(),
        pivots=torch.tensor(pivots, dtype=torch.long),
        cum_energy=torch.tensor(energies, dtype=torch.float64),
        coef=R[:k],
    )


def pivots_of_sketch(S: torch.Tensor, k: int) -> torch.Tensor:
    """Pivot order of a small (sketch) matrix: the first k pivots of its CPQR."""
    if S.device.type == "cpu" and lapack_available():
        return cpqr_lapack(S, k).pivots
    return cpqr_torch(S, k).pivots.to(S.device)
