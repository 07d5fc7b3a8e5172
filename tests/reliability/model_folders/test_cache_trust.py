"""Issue 33, H2 and the low item "cache and resume": a model cache someone else can write never runs code and is
never trusted. Resume state is safetensors + JSON (a planted pickle is refused, never loaded), a cache or resume
folder of another user or writable by group/others is refused, and a cached model whose files changed since
they were written (its content digest) is an error naming it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.errors import USER_ERRORS, UnsafePathError, one_line
from mmunlearn.presets.cache import LOG_FILE, content_digest, is_built, write_log
from mmunlearn.train import TrainConfig, causal_lm_loss, train
from tests.reliability.untrusted import digest_tree, write_pickle_bomb
from tests.tiny import tiny_causal_lm, tiny_tokenizer

CFG = TrainConfig(epochs=1, batch_size=2, grad_accum=1, lr=1e-3, seed=0)


@pytest.fixture(scope="module")
def texts():
    from mmunlearn.data.tofu import load_split

    return load_split("synthetic:n_authors=4,seed=0", "full")[:12]


def _run(tmp: Path, texts, **kw):
    tok = tiny_tokenizer()
    model = tiny_causal_lm(vocab=512, layers=1)
    return train(
        model,
        causal_lm_loss,
        texts,
        TextLLMAdapter(model, tok).collate,
        CFG,
        device="cpu",
        progress=False,
        checkpoint_dir=tmp / "ck",
        checkpoint_every=2,
        **kw,
    )


@pytest.fixture
def stopped(tmp_path, texts) -> Path:
    """A run stopped after step 3: its checkpoint folder (step_00000002) as this loop writes it."""
    _run(tmp_path, texts, on_step=lambda step, loss: step == 3)
    (step,) = (tmp_path / "ck").iterdir()
    return step


def test_resume_state_holds_no_pickle(stopped):
    names = {p.name for p in stopped.iterdir()}
    assert names and all(n.endswith((".safetensors", ".json")) for n in names), names
    for path in stopped.iterdir():
        assert not path.read_bytes().startswith(b"\x80"), path  # no pickle protocol header anywhere


@pytest.mark.parametrize("planted", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"])
def test_a_pickle_planted_in_a_resume_folder_is_refused_and_never_runs(stopped, tmp_path, texts, planted):
    marker = tmp_path / "PWNED"
    write_pickle_bomb(stopped / planted, marker)
    before = digest_tree(tmp_path / "ck")
    with pytest.raises(UnsafePathError) as err:
        _run(tmp_path, texts, resume=True)
    assert isinstance(err.value, USER_ERRORS) and str(stopped / planted) in one_line(err.value)
    assert "pickle" in one_line(err.value) and "\n" not in str(err.value)
    assert not marker.exists() and digest_tree(tmp_path / "ck") == before


def test_a_planted_accelerate_checkpoint_as_the_latest_step_is_refused(stopped, tmp_path, texts):
    """The exploit of the audit: a later step_* folder of accelerate's pickles, picked up as the latest."""
    marker = tmp_path / "PWNED"
    fake = stopped.parent / "step_99999999"
    fake.mkdir(mode=0o700)
    shutil.copyfile(stopped / "train_state.json", fake / "train_state.json")
    write_pickle_bomb(fake / "custom_checkpoint_0.pkl", marker)
    with pytest.raises(UnsafePathError, match="pickle"):
        _run(tmp_path, texts, resume=True)
    assert not marker.exists()


def test_a_resume_folder_writable_by_others_is_refused(stopped, tmp_path, texts):
    os.chmod(stopped, 0o777)
    with pytest.raises(UnsafePathError, match="writable by its group or by others") as err:
        _run(tmp_path, texts, resume=True)
    assert str(stopped) in one_line(err.value)
    os.chmod(stopped, 0o700)
    assert _run(tmp_path, texts, resume=True).resumed_from == 2  # the control: a private folder resumes


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_resume_file_owned_by_another_user_is_refused(stopped, tmp_path, texts):
    os.chown(stopped / "trainer.json", 4242, 4242)
    with pytest.raises(UnsafePathError, match="owned by another user"):
        _run(tmp_path, texts, resume=True)


def test_checkpoint_folders_are_private_whatever_the_umask(tmp_path, texts):
    old = os.umask(0o002)
    try:
        _run(tmp_path, texts, on_step=lambda step, loss: step == 3)
    finally:
        os.umask(old)
    for path in [tmp_path / "ck", *(tmp_path / "ck").rglob("*")]:
        assert path.stat().st_mode & 0o022 == 0, path


# --------------------------------------------------------------------------------------- cached models
@pytest.fixture
def cached(tmp_path) -> Path:
    """A cache holding one finished model, written as the builder writes it (under a umask of 002)."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    model = root / "micro-abc" / "base"
    old = os.umask(0o002)
    try:
        model.mkdir(parents=True)
        os.chmod(model.parent, 0o700)
        tiny_causal_lm(vocab=512, layers=1).save_pretrained(model)
        write_log(model, {"key": "abc", "final_loss": 1.0})
    finally:
        os.umask(old)
    return model


def test_a_cached_model_is_reused_while_its_files_match_the_digest(cached):
    log = json.loads((cached / LOG_FILE).read_text())
    assert log["content_sha256"] == content_digest(cached)
    assert is_built(cached, "abc", cached.parent.parent) and not is_built(cached, "other", cached.parent.parent)


def test_a_cached_model_whose_weights_were_swapped_is_an_error_naming_it(cached):
    other = tiny_causal_lm(vocab=512, layers=1, seed=1)
    os.chmod(cached / "model.safetensors", 0o600)
    other.save_pretrained(cached)  # train_log.json kept: the forgery of the audit
    before = digest_tree(cached)
    with pytest.raises(ValueError, match="changed since it was built") as err:
        is_built(cached, "abc", cached.parent.parent)
    assert str(cached) in str(err.value) and digest_tree(cached) == before


def test_a_cached_model_without_a_digest_is_rebuilt(cached):
    log = json.loads((cached / LOG_FILE).read_text())
    del log["content_sha256"]
    os.chmod(cached / LOG_FILE, 0o600)
    (cached / LOG_FILE).write_text(json.dumps(log))
    assert not is_built(cached, "abc", cached.parent.parent)


@pytest.mark.parametrize("where", ["root", "group", "model", "weights"])
def test_a_cache_folder_writable_by_group_or_others_is_refused(cached, where):
    path = {
        "root": cached.parent.parent,
        "group": cached.parent,
        "model": cached,
        "weights": cached / "model.safetensors",
    }[where]
    os.chmod(path, path.stat().st_mode | 0o020)
    with pytest.raises(UnsafePathError, match="writable by its group or by others") as err:
        is_built(cached, "abc", cached.parent.parent)
    assert str(path) in one_line(err.value)


def test_a_cached_model_is_written_private_under_a_permissive_umask(cached):
    for path in [cached, *cached.rglob("*")]:
        assert path.stat().st_mode & 0o022 == 0, path
