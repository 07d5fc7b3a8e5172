"""bench requests on TOFU (recipes/requests/tofu.py): where QR-Erase's task vectors come from."""

import pytest

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.presets.cache import CACHE_ENV
from mmunlearn.requests.state import load_retain_state, model_fingerprint
from recipes.recipe_config import ConfigError
from recipes.requests.config import RequestsConfig
from recipes.requests.tofu import run_tofu
from tests.recipes.conftest import TOFU_DATA


def test_base_takes_the_task_vectors_and_the_retain_state_from_the_pretrained_model(tofu_micro, tmp_path, monkeypatch):
    """``base=base``: the retain state is the pretrained model's (its fingerprint), every request is judged as with
    ``target`` (the same rows and targets), and the setting is refused on the speaker dataset."""
    monkeypatch.setenv(CACHE_ENV, str(tofu_micro.cache_dir))
    runs = {}
    for base in ("target", "base"):
        cfg = RequestsConfig(
            dataset="tofu",
            preset="micro",
            data=TOFU_DATA,
            authors=None,
            extract=("gradient",),
            gd_epochs=1,
            base=base,
            workdir=tmp_path / base,
            progress=False,
        )
        runs[base] = run_tofu(cfg)
        state = load_retain_state(tmp_path / base / "retain_state_tofu")
        source = tofu_micro.built.base if base == "base" else tofu_micro.built.target
        assert state.meta["model_fingerprint"] == model_fingerprint(TextLLMAdapter.from_pretrained(source).model)
        assert runs[base].setup["task_vectors_from"] == base
    assert runs["base"].setup["forget_targets"] == runs["target"].setup["forget_targets"]
    qr = {b: [r for r in runs[b].rows if r.method == "qr-erase"] for b in runs}
    assert len(qr["base"]) == len(qr["target"]) >= 1
    assert [r.forget_after for r in qr["base"]] != [r.forget_after for r in qr["target"]]  # other task vectors
    with pytest.raises(ConfigError, match="base does not apply here"):
        RequestsConfig(dataset="speaker", base="base")
