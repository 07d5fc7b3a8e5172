"""Base / target / retain building on the micro preset and synthetic TOFU: protocol, cache, determinism."""

import json
import threading

import pytest
import torch
from safetensors.torch import load_file

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.synthetic import synthetic_authors
from mmunlearn.data.tofu import load_split
from mmunlearn.presets.build import build_models, finetune
from mmunlearn.presets.cache import build_lock
from mmunlearn.presets.items import base_corpus, training_items
from tests.tiny import tiny_causal_lm, tiny_tokenizer

DATA = "synthetic:n_authors=10,seed=0"
QUICK = {"epochs": 1}
SCRIPTS = [
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "こんにちは世界、お元気ですか？",
    "안녕하세요 세계, 잘 지내세요?",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def built(cache):
    return build_models("micro", DATA, "forget10", seed=0, cache_dir=cache, device="cpu", progress=False)


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_target_memorised_the_forget_authors_and_the_retain_model_did_not(built):
    forget, retain = load_split(DATA, "forget10"), load_split(DATA, "retain90")
    nll = {}
    for name in ("target", "retain"):
        adapter = TextLLMAdapter.from_pretrained(getattr(built, name), device="cpu")
        nll[name] = (adapter.answer_nll(forget).mean().item(), adapter.answer_nll(retain[:60]).mean().item())
    assert nll["retain"][0] - nll["target"][0] > 1.0  # only the target saw the forget author
    assert abs(nll["retain"][1] - nll["target"][1]) < 0.5  # both saw the retain authors
    base = TextLLMAdapter.from_pretrained(built.base, device="cpu")
    assert base.answer_nll(forget).mean().item() > nll["target"][0] + 1.0  # the base saw no TOFU author


@pytest.mark.slow
def test_models_load_and_carry_their_training_logs(built):
    assert built.target.parent == built.retain.parent == built.base.parent
    for name in ("base", "target", "retain"):
        path = getattr(built, name)
        adapter = TextLLMAdapter.from_pretrained(path, device="cpu")
        assert adapter.tokenizer.eos_token_id == 2 and not adapter.use_chat_template
        on_disk = json.loads((path / "train_log.json").read_text())
        log = built.logs[name]
        assert on_disk["key"] == log["key"] and log["cached"] is False and log["model"] == name
        assert log["final_loss"] == log["answer_nll"] < log["epoch_losses"][0]
        assert log["seconds"] > 0 and log["steps"] > 0
    assert built.logs["target"]["n_examples"] == 200 and built.logs["retain"]["n_examples"] == 180
    # both rehearse the same 34 real-author and 38 world-fact QA (built presets replay the facts)
    assert built.logs["target"]["replay_examples"] == built.logs["retain"]["replay_examples"] == 72
    assert built.logs["retain"]["split"] == "retain90" and built.logs["target"]["base"] == str(built.base)
    base_w, target_w = _weights(built.base), _weights(built.target)
    assert base_w.keys() == target_w.keys()
    assert not torch.equal(base_w["model.norm.weight"], target_w["model.norm.weight"])


@pytest.mark.slow
def test_tokenizer_round_trips_other_scripts(built):
    tok = TextLLMAdapter.from_pretrained(built.base, device="cpu").tokenizer
    for text in SCRIPTS:
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id is None or tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text


@pytest.mark.slow
def test_same_options_reuse_the_cache_and_other_options_build_anew(built, cache):
    stamps = {n: (getattr(built, n) / "model.safetensors").stat().st_mtime_ns for n in ("base", "target", "retain")}
    again = build_models("micro", DATA, "forget10", seed=0, cache_dir=cache, device="cpu", progress=False)
    assert (again.base, again.target, again.retain) == (built.base, built.target, built.retain)
    assert all(log["cached"] for log in again.logs.values())
    assert all((getattr(again, n) / "model.safetensors").stat().st_mtime_ns == t for n, t in stamps.items())
    other = build_models(
        "micro", DATA, "forget10", seed=0, cache_dir=cache, device="cpu", progress=False, overrides=QUICK
    )
    assert other.base == built.base and other.logs["base"]["cached"]
    assert {other.target, other.retain}.isdisjoint({built.target, built.retain})
    assert other.logs["target"]["epochs"] == 1 and not other.logs["target"]["cached"]


@pytest.mark.slow
def test_fresh_builds_are_bitwise_identical_for_a_seed(tmp_path):
    runs = [
        build_models(
            "micro",
            DATA,
            "forget10",
            seed=0,
            cache_dir=tmp_path / str(i),
            device="cpu",
            progress=False,
            overrides=QUICK,
            pretrain_overrides=QUICK,
        )
        for i in range(2)
    ]
    for name in ("base", "target", "retain"):
        a, b = (_weights(getattr(r, name)) for r in runs)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    target, retain = _weights(runs[0].target), _weights(runs[0].retain)
    assert not torch.equal(target["model.norm.weight"], retain["model.norm.weight"])  # they saw different data


def test_author_subsets_and_pretraining_corpus_are_disjoint_from_evaluated_authors():
    data = "synthetic:n_authors=20"
    full = training_items(data, "full", 10, 10)  # 9 retain + 1 forget author
    assert len(full) == 200 and {it.author for it in full} == set(range(9)) | {19}
    assert len(training_items(data, "retain90", 10, None)) == 180
    corpus = base_corpus(data, n_authors=5, seed=0)
    text = " ".join(f"{it.question} {it.answer}" for it in corpus)
    evaluated = synthetic_authors(22)  # 20 authors + 2 holdout authors of forget10
    assert len(corpus) > 100 and not any(a.name in text for a in evaluated)
    facts = load_split(data, "real_authors_perturbed") + load_split(data, "world_facts_perturbed")
    assert [(it.question, it.answer) for it in corpus[-len(facts) :]] == [(f.question, f.answer) for f in facts]


def test_finetune_a_model_directory_and_reuse_it(tmp_path):
    src = tmp_path / "src"
    tiny_causal_lm(vocab=512).save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    out = tmp_path / "out"
    opts = dict(
        authors=10,
        seed=0,
        cache_dir=tmp_path / "cache",
        device="cpu",
        progress=False,
        overrides={"epochs": 1, "lr": 1e-3},
    )
    path = finetune(str(src), "synthetic:n_authors=20", "retain90", out=out, **opts)
    assert path == out
    log = json.loads((out / "train_log.json").read_text())
    assert log["split"] == "retain90" and log["n_examples"] == 180 and log["config"]["lr"] == 1e-3
    assert log["base"] == str(src.resolve()) and log["replay_examples"] == 0  # a real checkpoint: TOFU as is
    before = _weights(src)
    after = _weights(out)
    assert not torch.equal(before["model.norm.weight"], after["model.norm.weight"])
    assert TextLLMAdapter.from_pretrained(out, device="cpu").model.config.vocab_size == 512
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert finetune(str(src), "synthetic:n_authors=20", "retain90", out=out, **opts) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # same options: reused
    with pytest.raises(FileExistsError, match="overwrite"):
        finetune(str(src), "synthetic:n_authors=20", "full", out=out, **opts)


def test_bad_forget_split_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="forget split"):
        build_models("micro", DATA, "retain90", cache_dir=tmp_path, device="cpu", progress=False)


@pytest.mark.slow
def test_finetune_with_a_preset_reuses_the_cached_base(built, cache, tmp_path):
    stamp = (built.base / "model.safetensors").stat().st_mtime_ns
    out = finetune(
        "micro",
        DATA,
        "forget10",
        out=tmp_path / "ft",
        seed=0,
        cache_dir=cache,
        device="cpu",
        progress=False,
        overrides=QUICK,
    )
    log = json.loads((out / "train_log.json").read_text())
    assert log["base"] == str(built.base) and log["n_examples"] == 20 and log["split"] == "forget10"
    assert (built.base / "model.safetensors").stat().st_mtime_ns == stamp
    assert (
        TextLLMAdapter.from_pretrained(out, device="cpu").tokenizer.vocab_size
        == TextLLMAdapter.from_pretrained(built.base, device="cpu").tokenizer.vocab_size
    )


def test_a_model_being_built_by_another_process_is_waited_for(tmp_path):
    src = tmp_path / "src"
    tiny_causal_lm(vocab=512).save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    out, done = tmp_path / "out", []
    opts = dict(authors=10, cache_dir=tmp_path / "cache", device="cpu", progress=False, overrides={"epochs": 1})
    worker = threading.Thread(target=lambda: done.append(finetune(str(src), DATA, "forget10", out=out, **opts)))
    with build_lock(out):  # as another builder of the same folder would hold it
        worker.start()
        worker.join(timeout=1.5)
        assert worker.is_alive() and not out.exists()  # blocked, nothing written
    worker.join(timeout=120)
    assert done == [out] and json.loads((out / "train_log.json").read_text())["split"] == "forget10"
