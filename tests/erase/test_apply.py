"""erase() / restore() on real modules: localisation, retain protection, bitwise undo, bad input."""

import pytest
import torch

from mmunlearn.erase import EraseReport, UndoPatch, column_basis, erase, merge_erases, restore
from tests.tiny import ConvExperts, block_task_matrices, tiny_llama


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_only_selected_layers_change_and_undo_is_bitwise(tmp_path):
    model = tiny_llama()
    before = snapshot(model)
    tf = block_task_matrices(model, hot=1, seed=1)
    tr = block_task_matrices(model, hot=2, seed=2)
    report = erase(model, tf, tr, rank=4, out=tmp_path)
    assert report.selected == ["model.layers.1"]
    after = snapshot(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in tf if ".layers.1." in k}
    restore(model, tmp_path / "undo_patch.safetensors")
    assert same(before, snapshot(model))


def test_edit_leaves_no_component_in_retain_subspace():
    model = tiny_llama()
    before = snapshot(model)
    tf = block_task_matrices(model, hot=0, seed=3)
    tr = block_task_matrices(model, hot=0, seed=4)
    erase(model, tf, tr, rank=3, retain_rank=5, localize=False, scale=2.0)
    for name in tf:
        delta = (before[name] - model.state_dict()[name]).double()
        Qr = column_basis(tr[name], rank=5).Q.double()
        assert float((Qr.T @ delta).abs().max()) < 1e-6 * max(1.0, float(delta.abs().max()))
        # the edit is the scaled forget projection, rank <= 3
        assert torch.linalg.matrix_rank(delta, rtol=1e-4) <= 3


def test_report_lists_every_layer():
    model = tiny_llama()
    tf = block_task_matrices(model, hot=3)
    report = erase(model, tf, rank=2)
    assert isinstance(report, EraseReport)
    assert [r.layer for r in report.layers] == [f"model.layers.{i}" for i in range(4)]
    assert sum(report.energies.values()) == pytest.approx(1.0)
    hot = report.layers[3]
    assert hot.selected and hot.rank == 2 and len(hot.matrices) == 7 and hot.norm_removed > 0
    assert not report.layers[0].selected and report.layers[0].matrices == []
    d = report.to_dict()
    assert d["selected"] == ["model.layers.3"] and d["layers"][3]["rank"] == 2


def test_restore_from_report_in_memory_and_patch_roundtrip(tmp_path):
    model = tiny_llama(dtype=torch.bfloat16)
    before = snapshot(model)
    report = erase(
        model,
        {k: v.bfloat16() for k, v in block_task_matrices(model, hot=0, scale=0.05).items()},
        energy=0.5,
        localize=False,
    )
    assert not same(before, snapshot(model))
    path = report.patch.save(tmp_path / "p.safetensors")
    restore(model, UndoPatch.load(path))
    assert same(before, snapshot(model))
    with pytest.raises(ValueError, match="not the ones this patch produced"):
        restore(model, report)  # already restored: refused, nothing written
    assert same(before, snapshot(model))


def test_conv_kernels_and_fused_experts():
    model = ConvExperts()
    before = snapshot(model)
    tf = {n: torch.randn_like(p) for n, p in model.named_parameters() if p.dim() == 3}
    report = erase(model, tf, rank=2, localize=False)
    labels = {m.name for row in report.layers for m in row.matrices}
    assert "blocks.0.weight" in labels and "experts.1.gate_up_proj[3]" in labels
    shapes = {m.name: m.shape for row in report.layers for m in row.matrices}
    assert shapes["blocks.0.weight"] == (8, 18) and shapes["experts.0.gate_up_proj[0]"] == (10, 12)
    for e in range(4):  # every expert got its own rank-2 edit
        delta = before["experts.0.gate_up_proj"][e] - model.experts[0].gate_up_proj.data[e]
        assert torch.linalg.matrix_rank(delta.double(), rtol=1e-4) == 2
    restore(model, report)
    assert same(before, snapshot(model))


def test_state_dict_input_works_like_a_module():
    model = tiny_llama()
    sd = snapshot(model)
    tf = block_task_matrices(model, hot=2)
    erase(model, tf, rank=3)
    erase(sd, tf, rank=3)
    assert same(sd, snapshot(model))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda tf, m: tf.__setitem__("model.layers.1.mlp.up_proj.weight", torch.zeros(3, 3)), "shape"),
        (lambda tf, m: tf["model.layers.1.mlp.up_proj.weight"].__setitem__((0, 0), float("nan")), "NaN or Inf"),
        (lambda tf, m: m.model.layers[0].mlp.up_proj.weight.data.__setitem__((0, 0), float("inf")), "NaN or Inf"),
        (lambda tf, m: tf.__setitem__("model.layers.9.mlp.up_proj.weight", torch.zeros(3, 3)), "no erasable parameter"),
    ],
)
def test_bad_input_raises_before_any_weight_changes(mutate, match):
    model = tiny_llama()
    tf = block_task_matrices(model, hot=1)
    mutate(tf, model)
    before = snapshot(model)
    with pytest.raises((ValueError, KeyError), match=match):
        erase(model, tf, rank=2)
    assert same(before, snapshot(model))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 10_000}, "exceeds min"),
        ({"rank": 2, "method": "lu"}, "unknown subspace method"),
        ({"rank": 2, "threshold": 0.99}, "selected no layer"),
        ({"rank": 2, "scale": float("nan")}, "scale"),
    ],
)
def test_bad_options_raise_before_any_weight_changes(kwargs, match):
    model = tiny_llama()
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        erase(model, block_task_matrices(model), **kwargs)
    assert same(before, snapshot(model))


def test_retain_must_cover_the_forget_parameters():
    model = tiny_llama()
    tf = block_task_matrices(model, hot=1)
    tr = dict(list(block_task_matrices(model).items())[:3])
    with pytest.raises(KeyError, match="retain task matrices have no entry"):
        erase(model, tf, tr, rank=2)


def test_two_erases_merged_are_one_patch_that_undoes_both():
    """merge_erases: the weights are the two-step result (to float rounding), the merged patch holds one record per
    matrix edited by either erase and restores the original bits; the second erase alone could not undo the first."""
    model = tiny_llama()
    before = snapshot(model)
    first = erase(model, block_task_matrices(model, hot=1, seed=1), None, rank=4, localize=False, scale=0.5)
    second = erase(model, block_task_matrices(model, hot=2, seed=5), None, rank=2, localize=False, scale=0.3)
    two_steps = snapshot(model)
    labels = {e.label for e in (*first.patch.entries, *second.patch.entries)}
    merged = merge_erases(model, first, second)
    after = snapshot(model)
    assert all(torch.allclose(after[k], two_steps[k], atol=1e-6) for k in after)
    assert not same(after, before)
    assert sorted(e.label for e in merged.patch.entries) == sorted(labels)
    assert merged.seconds == pytest.approx(first.seconds + second.seconds)
    restore(model, merged)
    assert same(before, snapshot(model))
    with pytest.raises(ValueError, match="merge_erases needs"):
        merge_erases(model, EraseReport("cpqr", {}, [], 0.0), second)
