"""Truncated CPQR (LAPACK ?geqp3rk and the torch path) against scipy's full pivoted QR."""

import os

import numpy as np
import pytest
import scipy.linalg as sl
import torch

from mmunlearn.erase.subspace.cpqr import cpqr_lapack, cpqr_torch, lapack_available

PATHS = [
    pytest.param(cpqr_lapack, id="lapack", marks=pytest.mark.skipif(not lapack_available(), reason="no ?geqp3rk")),
    pytest.param(cpqr_torch, id="torch"),
]


def separated(m=120, n=90, r=30, seed=0, dtype=torch.float64):
    """Low-rank-plus-noise matrix whose columns have well-separated norms (no near-ties)."""
    g = torch.Generator().manual_seed(seed)
    T = torch.randn(m, r, generator=g, dtype=dtype) @ torch.randn(r, n, generator=g, dtype=dtype)
    T += 1e-3 * torch.randn(m, n, generator=g, dtype=dtype)
    return T * torch.linspace(1.0, 4.0, n, dtype=dtype)[torch.randperm(n, generator=g)]


@pytest.mark.parametrize("fn", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pivots_match_scipy_full_geqp3(fn, dtype):
    T = separated(dtype=dtype)
    _, _, piv = sl.qr(T.double().numpy(), pivoting=True, mode="economic")
    k = 12
    r = fn(T, k)
    assert r.pivots.tolist() == piv[:k].tolist()
    assert r.Q.shape == (T.shape[0], k)


@pytest.mark.parametrize("fn", PATHS)
def test_basis_orthonormal_energy_and_coefficients_exact(fn):
    T = separated(dtype=torch.float64)
    r = fn(T, 10)
    assert torch.allclose(r.Q.T @ r.Q, torch.eye(10, dtype=r.Q.dtype), atol=1e-10)
    # span(Q) is the span of the pivot columns
    cols = T[:, r.pivots]
    assert torch.allclose(r.Q @ (r.Q.T @ cols), cols, atol=1e-8)
    # cumulative energy is ||Q_j^T T||^2 for every prefix j
    want = torch.cumsum(((r.Q.T @ T) ** 2).sum(1), 0)
    assert torch.allclose(r.cum_energy, want, rtol=1e-10)
    assert torch.allclose(r.coef.double(), r.Q.T @ T, atol=1e-9)


@pytest.mark.parametrize("fn", PATHS)
def test_stops_at_k_pivots(fn):
    T = separated()
    r = fn(T, 5)
    assert len(r.pivots) == 5 and r.cum_energy.shape == (5,) and r.coef.shape == (5, T.shape[1])


def test_torch_stops_at_energy_target_and_at_numerical_rank():
    T = separated(r=8) - 0  # rank 8 plus small noise
    total = float((T**2).sum())
    r = cpqr_torch(T, 50, tau=0.5)
    assert r.cum_energy[-1] >= 0.5 * total and (len(r.cum_energy) == 1 or r.cum_energy[-2] < 0.5 * total)
    exact = torch.randn(60, 5, dtype=torch.float64) @ torch.randn(5, 40, dtype=torch.float64)
    assert len(cpqr_torch(exact, 30).pivots) == 5  # stops when the residual vanishes


def test_torch_norm_downdating_recomputes_stale_columns():
    # Columns that are nearly copies of each other make downdated norms lose all their digits;
    # pivots must still equal LAPACK's full pivoted QR.
    g = torch.Generator().manual_seed(3)
    base = torch.randn(80, 6, generator=g, dtype=torch.float64)
    T = torch.cat([base + 1e-7 * torch.randn(80, 6, generator=g, dtype=torch.float64) * (i + 1) for i in range(5)], 1)
    T = T * torch.linspace(1, 2, T.shape[1], dtype=torch.float64)
    _, _, piv = sl.qr(T.numpy(), pivoting=True, mode="economic")
    r = cpqr_torch(T, 10)
    assert r.pivots.tolist() == piv[:10].tolist()


def test_lapack_does_not_modify_input():
    T = separated(dtype=torch.float32)
    before = T.clone()
    Tf = T.t().contiguous().t()  # a Fortran-ordered view: must not be factorised in place either
    cpqr_lapack(T, 5)
    cpqr_lapack(Tf, 5)
    assert torch.equal(T, before) and torch.equal(Tf, before)
    assert isinstance(np.asarray(T), np.ndarray)


@pytest.mark.skipif(not lapack_available(), reason="scipy's OpenBLAS lacks ?geqp3rk")
def test_lapack_cpqr_uses_as_many_blas_threads_as_torch(monkeypatch):
    """OpenBLAS starts a thread per core whatever torch was told; inside cpqr_lapack it runs with torch's count
    (the toolkit's ``threads``), and the limit is lifted afterwards."""
    from threadpoolctl import threadpool_info

    from mmunlearn.erase.subspace import cpqr

    def openblas_threads() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}

    seen: list[set[int]] = []
    real = cpqr._geqp3rk

    def spy(a, kmax):
        seen.append(openblas_threads())
        return real(a, kmax)

    monkeypatch.setattr(cpqr, "_geqp3rk", spy)
    before, threads = openblas_threads(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        T = torch.randn(64, 40, generator=torch.Generator().manual_seed(0))
        r = cpqr_lapack(T, 8)
    finally:
        torch.set_num_threads(threads)
    assert seen == [{1}] and (max(before) > 1 or (os.cpu_count() or 1) == 1)  # OpenBLAS's own count was more
    assert openblas_threads() == before
    # the basis is still the pivoted QR's: orthonormal, spanning the chosen columns of T
    assert torch.allclose(r.Q.T @ r.Q, torch.eye(8), atol=1e-5)
    assert torch.allclose(r.Q @ (r.Q.T @ T[:, r.pivots]), T[:, r.pivots], atol=1e-4)
