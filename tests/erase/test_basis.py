"""column_basis: every registered method, rank and energy modes, diagnostics and bad input."""

import pytest
import torch

from mmunlearn.erase import METHODS, column_basis


def lowrank(m=96, n=70, r=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, r, generator=g))
    V, _ = torch.linalg.qr(torch.randn(n, r, generator=g))
    return (U * torch.linspace(5.0, 1.0, r)) @ V.T, U


@pytest.mark.parametrize("method", sorted(METHODS))
def test_exact_recovery_of_low_rank_matrix(method):
    T, U = lowrank()
    b = column_basis(T, rank=6, method=method)
    assert b.k == 6 and b.Q.shape == (96, 6)
    cosines = torch.linalg.svdvals(U.T @ b.Q)
    assert float(cosines.min()) >= 0.999
    assert b.captured == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_orthonormal_coef_and_captured_energy(method):
    torch.manual_seed(1)
    T = torch.randn(80, 60) @ torch.diag(torch.linspace(3, 0.1, 60))
    b = column_basis(T, rank=10, method=method)
    assert torch.allclose(b.Q.T @ b.Q, torch.eye(b.k), atol=1e-5)
    assert torch.allclose(b.coef, b.Q.T @ T, atol=1e-4)
    assert b.captured == pytest.approx(float((b.Q.T @ T).pow(2).sum() / T.pow(2).sum()), rel=1e-4)
    if b.pivots is not None:
        assert len(set(b.pivots.tolist())) == b.k


@pytest.mark.parametrize("method", sorted(METHODS))
def test_energy_mode_returns_smallest_sufficient_k(method):
    torch.manual_seed(2)
    T = torch.randn(90, 70) @ torch.diag(torch.logspace(0, -2, 70))
    tau = 0.8
    b = column_basis(T, energy=tau, method=method)
    assert b.captured >= tau - 1e-6
    if method in ("svd", "cpqr", "cpqr-lapack", "cpqr-torch"):  # deterministic prefixes: k-1 must fall short
        shorter = column_basis(T, rank=b.k - 1, method=method) if b.k > 1 else None
        assert shorter is None or shorter.captured < tau


@pytest.mark.parametrize("method", sorted(METHODS))
def test_lower_rank_than_asked_drops_empty_directions(method):
    T, _ = lowrank(r=3)
    b = column_basis(T, rank=10, method=method)
    assert b.k == 3


def test_cpqr_energy_beyond_first_block_grows_pivot_budget():
    torch.manual_seed(4)
    T = torch.randn(200, 150)  # flat spectrum: 99% energy needs far more than 64 directions
    b = column_basis(T, energy=0.99, method="cpqr")
    assert b.k > 64 and b.captured >= 0.99


def test_sketch_is_deterministic_for_a_seed():
    torch.manual_seed(5)
    T = torch.randn(100, 80)
    a = column_basis(T, rank=8, method="cpqr-sketch", seed=7)
    b = column_basis(T, rank=8, method="cpqr-sketch", seed=7)
    assert torch.equal(a.pivots, b.pivots) and torch.equal(a.Q, b.Q)


def test_zero_matrix_gives_empty_basis():
    b = column_basis(torch.zeros(10, 8), rank=3)
    assert b.k == 0 and b.Q.shape == (10, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 0}, "rank must be"),
        ({"rank": 41}, "rank must be"),
        ({"rank": 3, "energy": 0.5}, "exactly one"),
        ({}, "exactly one"),
        ({"energy": 1.5}, "energy must be"),
        ({"rank": 3, "method": "qr"}, "unknown subspace method"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        column_basis(torch.randn(50, 40), **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_raises(bad):
    T = torch.randn(20, 10)
    T[3, 4] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        column_basis(T, rank=2)


def test_non_matrix_input_raises():
    with pytest.raises(ValueError, match="2-D"):
        column_basis(torch.randn(5, 4, 3), rank=2)
