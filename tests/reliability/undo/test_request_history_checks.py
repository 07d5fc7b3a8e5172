"""Issue 33, low items on what a deletion-request history says: a ``relative_edit`` that is negative, non-finite or
absurd is not used as the next sweep's start (a warning naming the report), ``forget_speakers`` naming speakers the
model has no class for, or every retain speaker, are refused naming the report, and an undo record whose
``fix_idx`` points outside its matrix is a ValueError naming the tensor (not an IndexError)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from mmunlearn.erase.patch import apply_exact, revert_exact
from mmunlearn.errors import USER_ERRORS, one_line
from mmunlearn.files.layout import UNLEARN_REPORT
from mmunlearn.methods import UnlearnRequest
from mmunlearn.requests.history import History
from mmunlearn.requests.service import MAX_REUSED_EDIT, reusable_edit, run_request
from tests.reliability.untrusted import listing

SPEAKERS = ["id00001", "id00002", "id00003"]


@pytest.mark.parametrize(
    "value", [-5, -0.0001, math.nan, math.inf, -math.inf, 1e300, MAX_REUSED_EDIT * 2, "0.1", True, [0.1]]
)
def test_a_history_relative_edit_outside_the_sane_range_is_ignored_with_a_warning(tmp_path, caplog, value):
    history = History(tmp_path, [{"index": 1, "method": "qr-erase", "relative_edit": value}])
    with caplog.at_level(logging.WARNING, logger="mmunlearn.requests.service"):
        assert reusable_edit(history, history.requests[-1]) is None
    assert str(tmp_path / UNLEARN_REPORT) in caplog.text and "relative_edit" in caplog.text


@pytest.mark.parametrize("value", [0.05, MAX_REUSED_EDIT, 1e-6])
def test_a_sane_relative_edit_is_reused(tmp_path, caplog, value):
    history = History(tmp_path, [{"index": 1, "method": "qr-erase", "relative_edit": value}])
    assert reusable_edit(history, history.requests[-1]) == value and not caplog.text


@pytest.fixture(scope="module")
def speaker_adapter():
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter

    return SpeakerAdapter.build(SPEAKERS, preset="tiny", device="cpu", seed=0)


@pytest.mark.parametrize(
    "earlier, needle",
    [(["id09999"], "no class for (id09999)"), (["id00002", "id00003"], "every speaker of the retain set")],
)
def test_history_forget_speakers_that_are_not_classes_or_cover_the_retain_set_are_refused(
    speaker_adapter, tmp_path, earlier, needle
):
    history = History(tmp_path / "model", [{"index": 1, "method": "grad_ascent", "forget_speakers": earlier}])
    weights = {n: p.detach().clone() for n, p in speaker_adapter.model.named_parameters()}
    forget = [{"wav": str(tmp_path / "a.wav"), "spk_id": "id00001"}]
    retain = [{"wav": str(tmp_path / "b.wav"), "spk_id": s} for s in ("id00002", "id00003")]
    with pytest.raises(USER_ERRORS) as err:
        run_request(
            UnlearnRequest("grad_ascent", "speaker", out=tmp_path / "out", progress=False),
            speaker_adapter,
            forget,
            retain,
            history=history,
        )
    text = one_line(err.value)
    assert str(tmp_path / "model" / UNLEARN_REPORT) in text and needle in text, text
    assert listing(tmp_path) == set()  # no output, no temporary folder
    assert all(torch.equal(p, weights[n]) for n, p in speaker_adapter.model.named_parameters())


@pytest.mark.parametrize("bad", [[10**6], [-1], [0, 1]])
def test_an_undo_record_with_fix_idx_outside_its_matrix_is_a_value_error(bad):
    g = torch.Generator().manual_seed(0)
    view = torch.randn(4, 3, generator=g)
    entry, _ = apply_exact(view, torch.randn(4, 1, generator=g), torch.randn(1, 3, generator=g), "layer.weight")
    entry.fix_idx = torch.tensor(bad, dtype=torch.int32)  # [0, 1]: two indices for no value
    with pytest.raises(ValueError) as err:
        revert_exact(view, entry)
    assert "layer.weight" in str(err.value) and "fix_idx" in str(err.value)


def test_an_undo_record_with_its_own_fixes_still_reverts():
    g = torch.Generator().manual_seed(0)
    original = torch.randn(4, 3, generator=g)
    view = original.clone()
    entry, _ = apply_exact(view, torch.randn(4, 1, generator=g), torch.randn(1, 3, generator=g), "layer.weight")
    assert not torch.equal(view, original) and torch.equal(revert_exact(view, entry), original)  # the control
