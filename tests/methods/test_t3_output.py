"""A T3 output folder never loads as the unchanged target: transformers refuses its model and its tokenizer, each error
naming ``mmunlearn.load``, which gives the tilted model (also after the folder is moved or copied), paths it records
are relative, restore still works."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

import mmunlearn
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.restore import restore_folder
from mmunlearn.data.tofu import load_split
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.checkpoint import load_checkpoint
from mmunlearn.methods import UnlearnRequest, run_unlearning
from mmunlearn.tilt import TiltedCausalLM
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"


@pytest.fixture(scope="module")
def t3_run(tmp_path_factory):
    """(target folder, T3 output folder, the tilted model the harness returned) on a tiny Llama."""
    root = tmp_path_factory.mktemp("t3_output")
    TextLLMAdapter(tiny_causal_lm(layers=2, seed=3), tiny_tokenizer()).save(root / "target")
    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:16]
    target = TextLLMAdapter.from_pretrained(root / "target", device="cpu")
    request = UnlearnRequest(
        "t3",
        "text",
        size="micro",
        overrides=fast("t3"),
        out=root / "out",
        inputs=[root / "target"],
        cache_dir=str(root / "cache"),
        progress=False,
    )
    outcome = run_unlearning(request, target, forget, retain)
    return root / "target", root / "out", outcome.adapter.model


def _prompt():
    ids = tiny_tokenizer()("What genre does the author write?", return_tensors="pt")["input_ids"]
    return ids


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_transformers_refuses_the_t3_output_and_names_the_loader(t3_run):
    _, out, _ = t3_run
    with pytest.raises(ValueError, match=r"not a transformers version problem.*mmunlearn\.load"):
        AutoModelForCausalLM.from_pretrained(out)  # transformers' own advice to upgrade comes after it
    stub = r"not a tokenizer or package version problem.*mmunlearn\.load\(folder\)"
    with pytest.raises(Exception, match=stub) as err:
        AutoTokenizer.from_pretrained(out)  # without the stub: "You need to have sentencepiece or tiktoken installed"
    assert "You need to have sentencepiece" not in str(err.value) and "pip install" not in str(err.value)
    with pytest.raises(Exception, match=r"mmunlearn\.load\(folder\)"):
        PreTrainedTokenizerFast.from_pretrained(out)  # a concrete tokenizer class reads the same stub
    with pytest.raises(OSError):  # a concrete class reads the config but finds no weights at the top level
        LlamaForCausalLM.from_pretrained(out)
    assert not any(p.suffix == ".safetensors" for p in out.iterdir())
    assert {p.name for p in out.iterdir() if p.is_file()} >= {"config.json", "tokenizer.json"}  # stubs, no code
    assert not any(p.suffix == ".py" for p in out.rglob("*"))
    cfg = json.loads((out / "tilt" / "tilt_config.json").read_text())
    assert cfg["base_model"] == "base"  # relative: the folder beside tilt/


def test_load_gives_the_tilted_model_and_its_generations(t3_run):
    target, out, tilted = t3_run
    loaded = mmunlearn.load(out, device="cpu")
    model, tokenizer = loaded
    assert isinstance(model, TiltedCausalLM) and loaded.method == "t3" and loaded.kind == "text"
    assert tokenizer.get_vocab() == tiny_tokenizer().get_vocab()
    ids = _prompt()
    plain = AutoModelForCausalLM.from_pretrained(target)
    assert torch.allclose(_logits(model, ids), _logits(tilted, ids), atol=1e-6)
    assert not torch.allclose(_logits(model, ids), torch.log_softmax(_logits(plain, ids), -1), atol=1e-3)
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(input_ids=ids, **kwargs), tilted.generate(input_ids=ids, **kwargs))
    model.tap.remove()


def test_a_moved_or_copied_output_still_loads(t3_run, tmp_path):
    _, out, tilted = t3_run
    copied = shutil.copytree(out, tmp_path / "copied")
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(shutil.copytree(copied, tmp_path / "to_move"), moved)
    ids = _prompt()
    for folder in (copied, moved):
        model = mmunlearn.load(folder, device="cpu").model
        assert torch.allclose(_logits(model, ids), _logits(tilted, ids), atol=1e-6)
        model.tap.remove()


@pytest.mark.parametrize("recorded", ["/abs/base", "../base", "base/../../x", ".."])
def test_an_absolute_or_escaping_base_path_is_refused(t3_run, tmp_path, recorded):
    _, out, _ = t3_run
    bad = shutil.copytree(out, tmp_path / "bad")
    cfg_path = bad / "tilt" / "tilt_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "base_model": recorded}))
    with pytest.raises(UnsafePathError):
        mmunlearn.load(bad, device="cpu")
    with pytest.raises(UnsafePathError):  # even with the base given, the folder read back is refused
        TiltedCausalLM.load(bad / "tilt", base=tiny_causal_lm())


def test_a_base_link_leaving_the_folder_is_refused(t3_run, tmp_path):
    target, out, _ = t3_run
    bad = shutil.copytree(out, tmp_path / "bad")
    shutil.rmtree(bad / "base")
    (bad / "base").symlink_to(target.resolve(), target_is_directory=True)
    with pytest.raises(UnsafePathError):
        mmunlearn.load(bad, device="cpu")


def test_saving_a_tilt_with_a_path_for_its_base_is_refused(tmp_path):
    base = tiny_causal_lm()
    with pytest.raises(UnsafePathError):
        TiltedCausalLM(base, None, base_path=str(tmp_path / "model")).save(tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_restore_gives_the_target_back_bit_for_bit(t3_run, tmp_path):
    target, out, _ = t3_run
    restored = restore_folder(out, tmp_path / "restored")
    original, back = load_checkpoint(target).tensors, load_checkpoint(restored).tensors
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in original)
    assert not (restored / "tilt").exists() and not (restored / "base").exists()
    assert isinstance(AutoModelForCausalLM.from_pretrained(restored), LlamaForCausalLM)


def test_load_of_a_weight_editing_output_is_the_plain_model(t3_run, tmp_path):
    target, _, _ = t3_run
    forget, retain = load_split(SRC, "forget10")[:8], load_split(SRC, "retain90")[:16]
    adapter = TextLLMAdapter.from_pretrained(target, device="cpu")
    run_unlearning(
        UnlearnRequest(
            "grad_ascent",
            "text",
            size="micro",
            overrides=fast("grad_ascent", epochs=1),
            out=tmp_path / "ga",
            inputs=[target],
            progress=False,
        ),
        adapter,
        forget,
        retain,
    )
    loaded = mmunlearn.load(tmp_path / "ga", device="cpu")
    assert type(loaded.model) is LlamaForCausalLM and loaded.method == "grad_ascent"
    ids = _prompt()
    assert torch.equal(_logits(loaded.model, ids), _logits(AutoModelForCausalLM.from_pretrained(tmp_path / "ga"), ids))
    assert mmunlearn.load(target, device="cpu").method is None  # a plain model folder loads as it is
