"""Issue 33, low items for Hugging Face folders (hf-audio and text): pickled-only weights, a weight file linked out of
the folder, NaN weights, truncated safetensors, weights that do not fit the config, a Hub kernel or a quantisation
in config.json, absurd or negative sizes, an oversized config.json. Each is one error naming the file and what is
wrong, before transformers builds anything; the inputs stay byte-identical and nothing is written outside --out."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mmunlearn.errors import USER_ERRORS, one_line
from tests.reliability.untrusted import digest_tree, listing

SPEAKERS = ["id00001", "id00002"]


@pytest.fixture(scope="module")
def hf_master(tmp_path_factory) -> Path:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    cfg = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(8, 8),
        conv_kernel=(10, 5),
        conv_stride=(10, 5),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
    )
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True)
    return HFAudioAdapter.build(cfg, SPEAKERS, fe, device="cpu").save(tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture(scope="module")
def text_master(tmp_path_factory) -> Path:
    from tests.tiny import tiny_causal_lm, tiny_tokenizer

    folder = tmp_path_factory.mktemp("text") / "model"
    tiny_causal_lm(layers=1).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _bin_only(folder: Path) -> None:
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _linked_out(folder: Path) -> None:
    outside = folder.parent / "elsewhere.safetensors"
    shutil.move(folder / "model.safetensors", outside)
    os.symlink(outside, folder / "model.safetensors")


def _nan(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    name = sorted(n for n, t in tensors.items() if t.dim() == 2)[0]
    tensors[name][0, 0] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


#: case -> (how the folder is spoiled, what the one-line error says, the file it names)
CASES = {
    "pickle only": (_bin_only, "convert to safetensors", ""),
    "weights linked out": (_linked_out, "outside", "model.safetensors"),
    "NaN weights": (_nan, "NaN/Inf", ""),
    "truncated safetensors": (_truncated, "not a valid safetensors file", "model.safetensors"),
    "Hub kernel": (
        lambda f: _config(f, attn_implementation="kernels-community/flash-attn"),
        "Hub kernel",
        "config.json",
    ),
    "bitsandbytes": (
        lambda f: _config(f, quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True}),
        "quantised",
        "config.json",
    ),
    "100000 layers": (lambda f: _config(f, num_hidden_layers=100000), "num_hidden_layers is 100000", "config.json"),
    "huge widths": (lambda f: _config(f, hidden_size=10**7, intermediate_size=10**7), "parameters", "config.json"),
    "negative size": (lambda f: _config(f, hidden_size=-16), "cannot be negative", "config.json"),
    "1 MiB config": (lambda f: _config(f, padding=" " * (1 << 20)), "larger than", "config.json"),
}


def _check(exc: BaseException, folder: Path, needle: str, file: str) -> None:
    assert isinstance(exc, USER_ERRORS), (type(exc), exc)
    text = one_line(exc)
    assert needle in text and str(folder / file).rstrip("/") in text, text


def _wavs(root: Path) -> list[str]:
    import soundfile as sf

    (root / "audio").mkdir()
    for name in ("a", "b"):
        sf.write(root / "audio" / f"{name}.wav", np.zeros(8000, dtype="float32"), 16000)
    return [str(root / "audio" / f"{n}.wav") for n in ("a", "b")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_spoiled_hf_audio_folder_is_one_error_naming_the_file_and_writes_nothing(hf_master, tmp_path, case):
    from mmunlearn.api.unlearn import unlearn

    spoil, needle, file = CASES[case]
    a, b = _wavs(tmp_path)
    folder = Path(shutil.copytree(hf_master, tmp_path / "model"))
    spoil(folder)
    before, around = digest_tree(folder), listing(tmp_path)
    with pytest.raises(USER_ERRORS) as err:
        unlearn(
            folder,
            forget=[(a, SPEAKERS[0])],
            retain=[(b, SPEAKERS[1])],
            method="grad_ascent",
            out=tmp_path / "out",
            device="cpu",
            progress=False,
            rule=None,
        )
    _check(err.value, folder, needle, file)
    assert digest_tree(folder) == before and listing(tmp_path) == around


def test_weights_that_do_not_fit_the_config_are_one_error_naming_the_folder(hf_master, tmp_path):
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    folder = Path(shutil.copytree(hf_master, tmp_path / "model"))
    _config(folder, id2label={"0": "a", "1": "b", "2": "c"}, label2id={"a": 0, "b": 1, "c": 2})
    with pytest.raises(ValueError) as err:  # transformers: "You set ignore_mismatched_sizes to False ..."
        HFAudioAdapter.load(folder, device="cpu")
    _check(err.value, folder, "transformers cannot build the model", "")


@pytest.mark.parametrize(
    "case",
    [
        "pickle only",
        "weights linked out",
        "NaN weights",
        "Hub kernel",
        "100000 layers",
        "bitsandbytes",
        "negative size",
    ],
)
def test_a_spoiled_text_folder_is_one_error_naming_the_file(text_master, tmp_path, case):
    from mmunlearn.api.unlearn import load_model

    spoil, needle, file = CASES[case]
    folder = Path(shutil.copytree(text_master, tmp_path / "model"))
    spoil(folder)
    before = digest_tree(folder)
    with pytest.raises(USER_ERRORS) as err:
        load_model(folder, device="cpu")
    _check(err.value, folder, needle, file)
    assert digest_tree(folder) == before


def test_ordinary_folders_still_load(hf_master, text_master):
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter
    from mmunlearn.api.unlearn import load_model

    assert HFAudioAdapter.load(hf_master, device="cpu").sample_rate == 16000  # the controls
    assert load_model(text_master, device="cpu").model.config.num_hidden_layers == 1


def test_an_id2label_that_skips_a_class_is_one_error_naming_the_folder(hf_master, tmp_path):
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    folder = Path(shutil.copytree(hf_master, tmp_path / "model"))
    _config(folder, id2label={"0": "a", "5": "b"}, label2id={"a": 0, "b": 5})  # was "error: 5" (a KeyError)
    before = digest_tree(folder)
    with pytest.raises(ValueError) as err:
        HFAudioAdapter.load(folder, device="cpu")
    _check(err.value, folder, "id2label names no speaker for class(es) [1]", "")
    assert digest_tree(folder) == before
