"""Undo patches restore weights bit for bit when the weights hold negative zeros (a real checkpoint does:
Whisper-tiny.en's float16 file, converted): -0.0 equals 0.0 as a number, so only a bitwise check keeps it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmunlearn.erase import erase, restore
from mmunlearn.erase.patch import apply_exact, bits_differ, digest, revert_exact


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_negative_zero_comes_back_as_itself(dtype):
    W = torch.tensor([[-0.0, 1.0], [0.0, -2.0]], dtype=dtype)
    A = torch.tensor([[0.0], [0.25]], dtype=torch.float64)  # D is 0 on the first row: (-0 - 0) + 0 = +0
    B = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    view = W.clone()
    entry, _ = apply_exact(view, A, B, "w")
    assert 0 in entry.fix_idx.tolist()  # the -0.0 is recorded, though (W - D) + D == W as numbers
    back = revert_exact(view, entry)
    assert digest(back) == digest(W) and torch.signbit(back[0, 0])


def test_bits_differ_sees_signs_of_zero_that_equality_does_not():
    a, b = torch.tensor([-0.0, 1.0, 2.0]), torch.tensor([0.0, 1.0, 3.0])
    assert (a != b).tolist() == [False, False, True]
    assert bits_differ(a, b).tolist() == [True, False, True]


def test_erase_and_restore_keep_a_models_negative_zeros():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p[0, :4] = -0.0
    before = {n: digest(p) for n, p in model.named_parameters()}
    tf = {n: torch.randn(p.shape) for n, p in model.named_parameters()}
    tf = {n: t * (torch.arange(8) > 0).float()[:, None] for n, t in tf.items()}  # no update on the -0.0 row
    rep = erase(model, tf, rank=2, scale=1.0, localize=False)
    restore(model, rep)
    assert {n: digest(p) for n, p in model.named_parameters()} == before


def test_the_harness_counts_a_zero_that_changed_sign_as_an_edit():
    """A trained tensor whose only change is -0.0 -> 0.0 (AdamW's decay of a -0.0 weight with no gradient gives
    0.0) must be in the undo patch, or the restore is not bit for bit."""
    from mmunlearn.methods.harness import _check_edit

    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-0.0, 1.0], [2.0, 3.0]]))
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    assert _check_edit(before, model)[0] == []
    with torch.no_grad():
        model.weight[0, 0] = 0.0
    assert _check_edit(before, model)[0] == ["weight"]
