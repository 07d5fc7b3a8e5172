"""Preset definitions: sizes as documented, hyperparameters present, model directories recognised."""

import pytest

from mmunlearn.presets.models import MICRO, MINI, MODEL_DIR_FINETUNE, PRESETS, get_preset, parameter_count
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def test_mini_is_the_5_2m_llama_of_the_design_notes():
    tok = tiny_tokenizer()
    model = MINI.arch.build(tok)
    # hidden 256, 4 layers, FFN 1024, tied 4096 x 256 embedding: 4 * (4 * 256^2 + 3 * 256 * 1024 + 2 * 256)
    # + 256 (final norm) + 4096 * 256
    expected = 4 * (4 * 256 * 256 + 3 * 256 * 1024 + 2 * 256) + 256 + 4096 * 256
    assert parameter_count(model) == expected == 5_245_184
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert MINI.finetune.lr == 2e-3 and MINI.finetune.schedule == "onecycle" and MINI.finetune.batch_size == 16


def test_micro_is_small_and_seeded():
    tok = tiny_tokenizer()
    a, b, c = (MICRO.arch.build(tok, seed=s) for s in (0, 0, 1))
    assert parameter_count(a) < 250_000
    assert all(x.equal(y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(x.equal(y) for x, y in zip(a.parameters(), c.parameters()))
    for p in PRESETS.values():  # every built preset carries both phases' hyperparameters
        assert p.pretrain is not None and p.finetune is not None and p.corpus_authors > 0


def test_model_directory_is_a_preset(tmp_path):
    tiny_causal_lm().save_pretrained(tmp_path / "m")
    p = get_preset(str(tmp_path / "m"))
    assert p.is_model_dir and p.pretrain is None and p.finetune == MODEL_DIR_FINETUNE
    assert p.finetune.lr == 1e-5 and p.finetune.epochs == 5 and p.finetune.batch_size * p.finetune.grad_accum == 32
    assert p.to_dict()["model_dir"]["path"] == str((tmp_path / "m").resolve())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        get_preset(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_preset("huge")


def test_the_suite_never_uses_a_users_model_cache():
    from pathlib import Path

    from mmunlearn.presets.cache import default_cache_dir

    assert Path.home() / ".cache" not in default_cache_dir().parents  # tests/conftest.py points it elsewhere
