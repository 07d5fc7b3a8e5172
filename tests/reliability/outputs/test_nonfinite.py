"""No silent damage: an edit or a restore that would write NaN / Inf weights is refused before anything is
written; an edit larger than LARGE_UPDATE times the weights is warned about and flagged in the report."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch

from mmunlearn.erase.apply import _check_update_finite
from mmunlearn.erase.in_memory import erase_checkpoint, restore_checkpoint
from mmunlearn.erase.patch import UndoPatch, dense_entry
from mmunlearn.erase.report import LARGE_UPDATE
from mmunlearn.erase.stream import stream_erase_checkpoint, stream_restore_checkpoint
from mmunlearn.errors import NonFiniteError
from mmunlearn.files.checkpoint import check_finite
from tests.reliability.untrusted import digest_tree, listing, make_checkpoint, make_forget


def erase_stream(model, forget, out, **kw):
    return stream_erase_checkpoint(model, forget, out, rank=2, progress=False, **kw)


def erase_memory(model, forget, out, **kw):
    return erase_checkpoint(model, forget, out, rank=2, **kw)


ERASERS = [erase_stream, erase_memory]


@pytest.mark.parametrize("erase", ERASERS)
@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1e40), (torch.float16, 1e5), (torch.bfloat16, 1e40)])
def test_an_edit_that_overflows_the_dtype_is_refused(tmp_path, erase, dtype, scale):
    model = make_checkpoint(tmp_path / "model", dtype=dtype)
    forget = make_forget(tmp_path / "forget.safetensors")
    before, parent = digest_tree(model), listing(tmp_path)
    with pytest.raises(NonFiniteError, match=rf"erase of {re.escape(str(model))}.*model\.layers\.2\..*NaN or Inf"):
        erase(model, forget, tmp_path / "out", scale=scale)
    assert digest_tree(model) == before and listing(tmp_path) == parent


def test_a_large_but_finite_edit_passes_the_exact_check():
    """The quick bound max|W| + max||A_i|| max||B^j|| fails here, the exact edit is finite: no error."""
    W = torch.zeros(4, 4, dtype=torch.float16)
    W[1, 1] = 60000.0
    A = torch.zeros(4, 1, dtype=torch.float64)
    A[0, 0] = 100.0
    B = torch.zeros(1, 4, dtype=torch.float64)
    B[0, 0] = 100.0  # D[0, 0] = 1e4 lands where W is 0
    _check_update_finite("w", W, A, B, 1.0)
    A[1, 0], B[0, 1] = -100.0, 100.0  # now D[1, 1] = -1e4: W - D = 70000 there, beyond float16's 65504
    with pytest.raises(NonFiniteError, match="the edit of w would write NaN or Inf weights .float16 overflows"):
        _check_update_finite("w", W, A, B, 1.0)


def test_check_finite_names_the_tensor_and_counts_bad_entries():
    ok = {"a": torch.ones(3), "ids": torch.tensor([1, 2]), "half": torch.full((2,), 60000.0, dtype=torch.float16)}
    check_finite(ok, "save")  # the fp16 norm overflows, the entries are finite: no error
    bad = dict(ok, w=torch.tensor([1.0, float("nan"), float("inf")]))
    with pytest.raises(NonFiniteError, match=r"save: w would hold 2 NaN/Inf value\(s\) of 3"):
        check_finite(bad, "save")
    with pytest.raises(NonFiniteError, match="x would hold 1"):
        check_finite([("x", torch.tensor([float("-inf")], dtype=torch.bfloat16))], "w")


@pytest.mark.parametrize("restore", ["stream", "memory"])
def test_restore_refuses_a_patch_that_would_write_inf(tmp_path, restore):
    model = make_checkpoint(tmp_path / "model")
    erased = tmp_path / "erased"
    erase_stream(model, make_forget(tmp_path / "forget.safetensors"), erased)
    assert not (erased / "undo_patch.safetensors").exists()  # kept apart, beside the output
    undo = UndoPatch.load(tmp_path / "erased.undo" / "undo_patch.safetensors")
    from safetensors.torch import load_file

    entry = undo.entries[0]
    current = load_file(str(erased / "model-00003-of-00003.safetensors"))[entry.label]
    poisoned = current.clone()
    poisoned[0, 0] = float("inf")
    undo.entries[0] = dense_entry(entry.label, poisoned, current)  # digests match: only the values are bad
    patch = undo.save(tmp_path / "poisoned.safetensors")
    before, parent = digest_tree(erased), listing(tmp_path)
    with pytest.raises(NonFiniteError, match=rf"restore of {re.escape(str(erased))}.*{re.escape(entry.label)}"):
        if restore == "stream":
            stream_restore_checkpoint(erased, tmp_path / "back", patch=patch, progress=False)
        else:
            restore_checkpoint(erased, tmp_path / "back", patch=patch)
    assert digest_tree(erased) == before and listing(tmp_path) == parent


def test_a_patch_entry_that_does_not_fit_its_matrix_is_refused(tmp_path):
    model = make_checkpoint(tmp_path / "model")
    erased = tmp_path / "erased"
    erase_stream(model, make_forget(tmp_path / "forget.safetensors"), erased)
    assert not (erased / "undo_patch.safetensors").exists()  # kept apart, beside the output
    undo = UndoPatch.load(tmp_path / "erased.undo" / "undo_patch.safetensors")
    undo.entries[0].A = torch.zeros(3, undo.entries[0].A.shape[1], dtype=torch.float64)
    patch = undo.save(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="does not fit its 8 x 6 matrix"):
        stream_restore_checkpoint(erased, tmp_path / "back", patch=patch, progress=False)
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize("erase", ERASERS)
def test_large_updates_are_warned_about_and_flagged_in_the_report(tmp_path, erase, caplog):
    model = make_checkpoint(tmp_path / "model")
    forget = make_forget(tmp_path / "forget.safetensors")
    with caplog.at_level(logging.WARNING, logger="mmunlearn.erase.apply"):
        small = erase(model, forget, tmp_path / "small")
    assert small.large_update_layers == [] and "large edit" not in caplog.text
    assert max(m.rel_norm_removed for row in small.layers for m in row.matrices) < LARGE_UPDATE
    with caplog.at_level(logging.WARNING, logger="mmunlearn.erase.apply"):
        big = erase(model, forget, tmp_path / "big", scale=30.0)
    assert big.large_update_layers == ["model.layers.2"]
    assert "large edit of model.layers.2." in caplog.text
    saved = json.loads((tmp_path / "big" / "erase_report.json").read_text())
    assert saved["large_update_layers"] == ["model.layers.2"] and saved["large_update_threshold"] == LARGE_UPDATE
    assert json.loads((tmp_path / "small" / "erase_report.json").read_text())["large_update_layers"] == []
    assert "warning" in str(big.table().caption) and big.table().caption is not None
    assert small.table().caption is None
