"""Factored (LoRA) task matrices: bases, energies and erasure from the factors equal the dense ones,
and the erase path never forms the m x n matrix."""

import pytest
import torch

from mmunlearn.erase import column_basis, erase, layer_energy, restore
from mmunlearn.erase.norms import sq_norm
from mmunlearn.taskvec import LowRank, load_task_matrices, save_task_matrices
from tests.tiny import tiny_llama


def lowrank_task(model, hot: int, seed: int, r: int = 3) -> dict[str, LowRank]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.dim() == 2 and ".layers." in name:
            gain = 4.0 if f".layers.{hot}." in name else 1.0
            out[name] = LowRank(
                0.1 * gain * torch.randn(p.shape[0], r, generator=g), torch.randn(r, p.shape[1], generator=g)
            )
    return out


def test_norm_basis_and_coefficients_match_the_dense_matrix():
    g = torch.Generator().manual_seed(0)
    T = LowRank(torch.randn(40, 5, generator=g), torch.randn(5, 24, generator=g))
    D = T.dense()
    assert sq_norm(T) == pytest.approx(float(D.double().pow(2).sum()), rel=1e-6)
    for k in (1, 3, 5):
        fac, den = column_basis(T, rank=k, method="svd"), column_basis(D, rank=k, method="svd")
        assert fac.k == den.k == k and fac.captured == pytest.approx(den.captured, rel=1e-5)
        assert torch.allclose(fac.Q.T @ fac.Q, torch.eye(k), atol=1e-5)
        assert torch.allclose(fac.coef, fac.Q.T @ D, atol=1e-4)
        # the same subspace as the dense SVD: projectors agree
        assert torch.allclose(fac.Q @ fac.Q.T, den.Q @ den.Q.T, atol=1e-4)
    full = column_basis(T, rank=12, method="cpqr")  # asking for more than rank(T) gives rank(T)
    assert full.k == 5 and full.captured == pytest.approx(1.0, abs=1e-6)
    assert column_basis(T, energy=0.999, method="cpqr").k <= 5
    with pytest.raises(ValueError, match="rank"):
        column_basis(T, rank=25)
    with pytest.raises(ValueError, match="NaN"):
        column_basis(LowRank(torch.full((4, 2), float("nan")), torch.ones(2, 3)), rank=1)


def test_erase_from_factors_equals_erase_from_dense_and_never_materialises(monkeypatch, tmp_path):
    dense_model, fac_model = tiny_llama(), tiny_llama()
    tf, tr = lowrank_task(dense_model, hot=1, seed=1), lowrank_task(dense_model, hot=2, seed=2)
    assert layer_energy(tf) == pytest.approx(layer_energy({n: t.dense() for n, t in tf.items()}), rel=1e-5)
    dense_report = erase(
        dense_model,
        {n: t.dense() for n, t in tf.items()},
        {n: t.dense() for n, t in tr.items()},
        rank=2,
        retain_rank=3,
        method="svd",
        scale=3.0,
    )
    before = {k: v.clone() for k, v in fac_model.state_dict().items()}

    def refuse(self):
        raise AssertionError("the erase path materialised a factored task matrix")

    monkeypatch.setattr(LowRank, "dense", refuse)
    report = erase(fac_model, tf, tr, rank=2, retain_rank=3, method="svd", scale=3.0, out=tmp_path)
    assert report.selected == dense_report.selected == ["model.layers.1"]
    a, b = dense_model.state_dict(), fac_model.state_dict()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-5), name  # float32 rounding apart
    for name in tf:  # the edit has no component in the retain subspace
        if ".layers.1." in name:
            delta = (before[name] - b[name]).double()
            Qr = column_basis(tr[name], rank=3, method="svd").Q.double()
            assert float((Qr.T @ delta).abs().max()) < 1e-6 * max(1.0, float(delta.abs().max()))
    restore(fac_model, tmp_path / "undo_patch.safetensors")
    assert all(torch.equal(before[k], v) for k, v in fac_model.state_dict().items())


def test_saved_factored_matrices_load_dense(tmp_path):
    g = torch.Generator().manual_seed(3)
    T = LowRank(torch.randn(6, 2, generator=g), torch.randn(2, 5, generator=g))
    save_task_matrices(tmp_path / "t.safetensors", {"w": T}, {"kind": "lora"})
    loaded = load_task_matrices(tmp_path / "t.safetensors")
    assert torch.equal(loaded["w"], T.dense()) and loaded.meta["kind"] == "lora"
    with pytest.raises(ValueError, match="B"):
        LowRank(torch.ones(6, 2), torch.ones(3, 5))
