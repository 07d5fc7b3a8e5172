"""A T3 output's head is data of its own ``tilt/`` folder: a head file linked to one outside the folder is refused,
naming the link, and a head holding NaN/Inf is refused, naming the file and tensor (it would tilt every answer into
garbage); nothing is written and the folder is left as it was."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import mmunlearn
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.unlearn import unlearn
from mmunlearn.errors import UnsafePathError
from mmunlearn.tilt.model import HEAD_NAME
from tests.reliability.untrusted import digest_tree
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def t3_out(tmp_path_factory):
    root = tmp_path_factory.mktemp("t3_heads")
    TextLLMAdapter(tiny_causal_lm(layers=1, seed=4), tiny_tokenizer()).save(root / "model")
    rows = [{"question": f"Where does person {i} live?", "answer": f"At {i} Oak Road."} for i in range(8)]
    unlearn(
        root / "model",
        forget=rows[:2],
        retain=rows[2:],
        method="t3",
        out=root / "out",
        rule=None,
        device="cpu",
        size="micro",
        progress=False,
        **fast("t3"),
    )
    return root / "out"


def test_a_head_linked_outside_its_folder_is_refused(t3_out, tmp_path):
    out = shutil.copytree(t3_out, tmp_path / "out", symlinks=True)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(out / "tilt" / HEAD_NAME, outside)
    os.symlink(outside, out / "tilt" / HEAD_NAME)
    before = digest_tree(out)
    with pytest.raises(UnsafePathError, match=rf"{HEAD_NAME} is a symbolic link to .*outside"):
        mmunlearn.load(out, device="cpu")
    assert digest_tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.safetensors", "out"]


def test_a_nan_head_is_refused_naming_the_file(t3_out, tmp_path):
    out = shutil.copytree(t3_out, tmp_path / "out")
    state = load_file(str(out / "tilt" / HEAD_NAME))
    state["B.bias"] = torch.full_like(state["B.bias"], float("nan"))
    save_file(state, str(out / "tilt" / HEAD_NAME))
    before = digest_tree(out)
    with pytest.raises(ValueError, match=rf"{HEAD_NAME}: B\.bias hold\(s\) NaN/Inf"):
        mmunlearn.load(out, device="cpu")
    assert digest_tree(out) == before
