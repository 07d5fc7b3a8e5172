"""Stopped builds and build options: resume of a model-directory build, stale locks, max_steps, forget NLL."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.presets import build
from mmunlearn.presets.build import CHECKPOINT_EVERY_MODEL_DIR, finetune, planned_steps
from mmunlearn.presets.cache import build_lock
from mmunlearn.train import TrainConfig
from tests.tiny import tiny_causal_lm, tiny_tokenizer

DATA = "synthetic:n_authors=10,seed=0"
# forget10 of 10 authors: 20 rows; batch 4 -> 5 optimizer steps per epoch, 10 in all
SMALL = {"epochs": 2, "batch_size": 4, "grad_accum": 1, "lr": 1e-3}
REPO = Path(__file__).resolve().parents[2]


class Stop(Exception):
    """Stands for a kill in the middle of training."""


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "model"
    tiny_causal_lm(vocab=512).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _opts(cache, **overrides):
    return dict(authors=10, seed=0, cache_dir=cache, device="cpu", progress=False, overrides={**SMALL, **overrides})


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_a_stopped_model_directory_build_resumes_to_the_uninterrupted_weights(src, tmp_path, monkeypatch):
    assert CHECKPOINT_EVERY_MODEL_DIR == 5
    ref = finetune(str(src), DATA, "forget10", out=tmp_path / "ref", **_opts(tmp_path / "c1"))
    ref_log = json.loads((ref / "train_log.json").read_text())
    assert ref_log["steps"] == 10 and ref_log["resumed_from_step"] == 0

    real_train = build.train

    def stopping_train(*args, **kwargs):  # checkpoint_every="auto" saves at step 5; stop at step 8
        def on_step(step, loss):
            if step == 8:
                raise Stop

        return real_train(*args, **kwargs, on_step=on_step)

    cache = tmp_path / "c2"
    monkeypatch.setattr(build, "train", stopping_train)
    with pytest.raises(Stop):
        finetune(str(src), DATA, "forget10", out=tmp_path / "cut", **_opts(cache))
    assert not (tmp_path / "cut").exists()
    saved = [p for p in cache.rglob("step_*") if p.is_dir()]
    assert [p.name for p in saved] == ["step_00000005"] and saved[0].parent.parent.name == ".resume"
    monkeypatch.setattr(build, "train", real_train)

    out = finetune(str(src), DATA, "forget10", out=tmp_path / "cut", **_opts(cache))
    log = json.loads((out / "train_log.json").read_text())
    assert log["resumed_from_step"] == 5 and log["steps"] == 10 and log["key"] == ref_log["key"]
    a, b = _weights(ref), _weights(out)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not (saved[0].parent).exists()  # the resume state is removed once the model is written


def test_a_lock_file_left_by_a_killed_builder_does_not_block_the_next_build(tmp_path):
    out = tmp_path / "cache" / "model"
    holder = (
        "import sys, time; from pathlib import Path; from mmunlearn.presets.cache import build_lock\n"
        "with build_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    got, release = threading.Event(), threading.Event()

    def next_build():
        with build_lock(out):
            got.set()
            release.wait(30)

    waiter = threading.Thread(target=next_build)
    try:
        assert proc.stdout.readline().strip() == "locked"
        waiter.start()
        assert not got.wait(1.0)  # a live holder blocks
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (out.parent / ".model.lock").exists()  # the killed builder's lock file is still there...
    try:
        assert got.wait(10)  # ...yet the lock died with its process: the next build goes ahead
    finally:
        release.set()
        waiter.join(10)


def test_max_steps_caps_the_run_and_leaves_shorter_runs_unchanged(src, tmp_path):
    cfg = TrainConfig(epochs=3, batch_size=4, grad_accum=2)
    assert planned_steps(cfg, 20) == 9 and planned_steps(cfg, 21) == 9 and planned_steps(cfg, 25) == 12
    assert planned_steps(TrainConfig(steps=7), 1000) == 7
    capped = finetune(str(src), DATA, "forget10", out=tmp_path / "capped", **_opts(tmp_path / "c", max_steps=3))
    log = json.loads((capped / "train_log.json").read_text())
    assert log["steps"] == 3 and log["config"]["steps"] == 3 and log["config"]["epochs"] is None
    plain = finetune(str(src), DATA, "forget10", out=tmp_path / "plain", **_opts(tmp_path / "c"))
    plain_log = json.loads((plain / "train_log.json").read_text())
    assert plain_log["steps"] == planned_steps(TrainConfig.from_dict(plain_log["config"]), 20) == 10
    assert plain_log["key"] != log["key"]
    stamp = (plain / "model.safetensors").stat().st_mtime_ns
    # a cap above the planned steps changes nothing: same key, the model found is reused
    again = finetune(str(src), DATA, "forget10", out=plain, **_opts(tmp_path / "c", max_steps=10))
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="max_steps"):
        finetune(str(src), DATA, "forget10", out=tmp_path / "bad", **_opts(tmp_path / "c", max_steps=0))
    with pytest.raises(ValueError, match="checkpoint_every"):
        finetune(str(src), DATA, "forget10", out=tmp_path / "bad", checkpoint_every=0, **_opts(tmp_path / "c"))


def test_the_train_log_holds_the_answer_nll_of_the_forget_rows(src, tmp_path):
    opts = _opts(tmp_path / "c", epochs=1)
    full = finetune(str(src), DATA, "full", out=tmp_path / "full", **opts)
    log = json.loads((full / "train_log.json").read_text())
    forget = load_split(DATA, "forget10", authors=10, forget_pct=10)
    adapter = TextLLMAdapter.from_pretrained(full, device="cpu")
    assert log["forget_examples"] == len(forget) == 20 and log["n_examples"] == 200
    assert log["forget_answer_nll"] == pytest.approx(float(adapter.answer_nll(forget, batch_size=32).mean()), rel=1e-4)
    # a model directory skips the all-rows NLL (minutes on a CPU for a real checkpoint); the forget rows'
    # probability and greedy ROUGE-L are measured before and after training
    assert log["answer_nll"] is None and log["final_loss"] == log["train_loss"]
    # exp turns the NLL's absolute float32 difference (~1e-4 nats at NLL ~5.6: the model in memory vs read back)
    # into the same relative difference of the probability
    assert log["forget_prob"] == pytest.approx(
        float(torch.exp(-adapter.answer_nll(forget, batch_size=32)).mean()), rel=5e-4
    )
    assert 0.0 <= log["forget_rouge"] <= 1.0 and log["pretrained_forget_prob"] < log["forget_prob"]
    retain = json.loads(
        (finetune(str(src), DATA, "retain90", out=tmp_path / "r", **opts) / "train_log.json").read_text()
    )
    assert retain["forget_answer_nll"] is None and retain["forget_examples"] == 0
