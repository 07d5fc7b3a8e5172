"""Retain discrimination leaves no component in the retain subspace."""

import pytest
import torch

from mmunlearn.erase import column_basis, discriminate, discriminate_factors


def orth(m, k, seed):
    return torch.linalg.qr(torch.randn(m, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))[0]


def test_no_component_left_in_retain_column_space():
    Tf = torch.randn(64, 48, dtype=torch.float64)
    Qf, Qr = column_basis(Tf, rank=8).Q, orth(64, 12, 1)
    Tt = discriminate(Qf, Tf, Qr)
    assert float((Qr.T @ Tt).abs().max()) < 1e-12
    # and it equals the formula (I - Qr Qr^T) Qf Qf^T Tf
    want = (torch.eye(64, dtype=torch.float64) - Qr @ Qr.T) @ Qf @ Qf.T @ Tf
    assert torch.allclose(Tt, want, atol=1e-12)


def test_row_space_option_also_removes_retain_rows():
    Tf = torch.randn(40, 30, dtype=torch.float64)
    Qf, Qr, Pr = column_basis(Tf, rank=6).Q, orth(40, 5, 2), orth(30, 4, 3)
    Tt = discriminate(Qf, Tf, Qr, Pr)
    assert float((Qr.T @ Tt).abs().max()) < 1e-12
    assert float((Tt @ Pr).abs().max()) < 1e-12


def test_without_retain_it_is_the_forget_projection():
    Tf = torch.randn(30, 20, dtype=torch.float64)
    Qf = column_basis(Tf, rank=4).Q
    assert torch.allclose(discriminate(Qf, Tf), Qf @ Qf.T @ Tf, atol=1e-12)


def test_forget_inside_retain_subspace_leaves_nothing():
    Qr = orth(50, 10, 4)
    Tf = Qr[:, :3] @ torch.randn(3, 25, dtype=torch.float64)
    Qf = column_basis(Tf, rank=3).Q
    assert float(discriminate(Qf, Tf, Qr).abs().max()) < 1e-10


def test_factors_use_given_coefficients():
    Tf = torch.randn(30, 20, dtype=torch.float64)
    b = column_basis(Tf, rank=5)
    A, B = discriminate_factors(b.Q, Tf, orth(30, 3, 5), coef=b.coef)
    assert A.shape == (30, 5) and B.shape == (5, 20)
    assert torch.allclose(A @ B, discriminate(b.Q, Tf, orth(30, 3, 5)), atol=1e-10)


@pytest.mark.parametrize("which", ["Q_r", "P_r", "Q_f"])
def test_shape_mismatch_raises(which):
    Tf = torch.randn(30, 20)
    args = {"Q_f": orth(30, 4, 0).float(), "T_f": Tf, "Q_r": orth(30, 3, 1).float(), "P_r": orth(20, 3, 2).float()}
    args[which] = torch.randn(7, 3)
    with pytest.raises(ValueError, match=which):
        discriminate(**args)
