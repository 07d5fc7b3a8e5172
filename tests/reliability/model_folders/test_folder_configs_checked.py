"""Every model folder's configs are checked before transformers reads them, and no folder's custom code is asked
about or run: a speech LLM's ``config.json`` naming a Hub kernel (top level or ``text_config``), asking for 20,000
layers or holding ``text_config`` as a list, its ``preprocessor_config.json`` asking for ``n_fft: 2**31``, each give
one error naming the file and key; a folder with ``auto_map`` loads (or is refused) with ``trust_remote_code=False``,
so transformers never asks "run the custom code? [y/N]" and nothing in the folder runs."""

from __future__ import annotations

import builtins
import json
import shutil

import pytest

from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from tests.reliability.untrusted import digest_tree
from tests.speech_corpus import llm_dir, speaker_manifests  # noqa: F401  (fixtures)
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def _edit(folder, name, change):
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


CASES = {
    "kernel": (
        "config.json",
        lambda c: {**c, "attn_implementation": "kernels-community/flash-attn2"},
        r"attn_implementation 'kernels-community/flash-attn2' names a Hub kernel",
    ),
    "nested kernel": (
        "config.json",
        lambda c: {**c, "text_config": {**c.get("text_config", {}), "_attn_implementation": "kernels-community/x"}},
        r"text_config\._attn_implementation .* names a Hub kernel",
    ),
    "layers": (
        "config.json",
        lambda c: {**c, "text_config": {**c.get("text_config", {}), "num_hidden_layers": 20000}},
        r"text_config\.num_hidden_layers is 20000, more than the 1000 layers",
    ),
    "more layers": (
        "config.json",
        lambda c: {
            **c,
            "text_config": {
                **{k: v for k, v in c["text_config"].items() if k != "layer_types"},
                "num_hidden_layers": c["text_config"]["num_hidden_layers"] + 2,
            },
        },
        r"the weights do not fill the model config\.json describes: \d+ tensor\(s\) missing",
    ),
    "layer types": (
        "config.json",
        lambda c: {
            **c,
            "text_config": {**c["text_config"], "num_hidden_layers": c["text_config"]["num_hidden_layers"] + 2},
        },
        r"transformers cannot build the model from this folder .*layer_types",
    ),
    "list": ("config.json", lambda c: {**c, "text_config": [1, 2]}, r"text_config is a JSON list, not an object"),
    "n_fft": ("preprocessor_config.json", lambda c: {**c, "n_fft": 2**31}, r"n_fft is 2147483648, outside 1\.\.16384"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_speech_llm_config_is_checked_before_transformers_reads_it(llm_dir, tmp_path, case):  # noqa: F811
    name, change, message = CASES[case]
    folder = shutil.copytree(llm_dir, tmp_path / "llm")
    _edit(folder, name, change)
    before = digest_tree(folder)
    with pytest.raises(ValueError, match=message) as err:
        SpeechLLMAdapter.load(folder, device="cpu")
    named = folder if case in ("more layers", "layer types") else folder / name  # built: the folder is named
    assert str(named) in str(err.value)
    assert digest_tree(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["llm"]


def test_custom_code_in_a_text_folder_is_never_asked_about_or_run(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    TextLLMAdapter(tiny_causal_lm(layers=1), tiny_tokenizer()).save(folder)
    marker = tmp_path / "ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    auto = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}
    _edit(folder, "config.json", lambda c: {**c, "model_type": "evil", "auto_map": auto})  # only its code knows it
    _edit(folder, "tokenizer_config.json", lambda c: {**c, "auto_map": {"AutoTokenizer": ["modeling_evil.T", None]}})
    asked = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "y")  # a user answering yes
    before = digest_tree(folder)
    with pytest.raises(ValueError, match="custom code"):
        TextLLMAdapter.from_pretrained(folder, device="cpu")
    assert asked == [] and not marker.exists()
    assert digest_tree(folder) == before


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_nested_100000_deep_is_one_error_naming_the_folder(tmp_path, name):
    folder = tmp_path / "model"
    TextLLMAdapter(tiny_causal_lm(layers=1), tiny_tokenizer()).save(folder)
    (folder / name).write_text("[" * 100_000 + "]" * 100_000)
    before = digest_tree(folder)
    with pytest.raises(ValueError, match=rf"{folder}: .*recursion") as err:
        TextLLMAdapter.from_pretrained(folder, device="cpu")
    assert not isinstance(err.value, RecursionError)
    assert digest_tree(folder) == before
