"""Issue 33, low items: resource bombs refused before the work they would cause (a GGUF asking for a million blocks,
a chat template writing gigabytes, a 4 GiB sparse wav, ``--segment-seconds inf``), and bad values that gave a
traceback (``crop_seconds=.inf``, a sample rate of 0 Hz). Each is one error naming the file or setting; the inputs
stay byte-identical and nothing is written outside the output folder."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mmunlearn.errors import USER_ERRORS, one_line
from tests.reliability.untrusted import digest_tree, listing, run_cli_here


def _gguf(path: Path, blocks: int) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(blocks)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_context_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("blocks", [10**6, -1 & 0xFFFFFFFF])
def test_a_gguf_asking_for_a_million_blocks_is_refused_before_building(tmp_path, blocks):
    from mmunlearn.presets.gguf import hf_from_gguf

    source = _gguf(tmp_path / "bomb.gguf", blocks)
    before = source.read_bytes()
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        hf_from_gguf(source, tmp_path / "out")
    assert str(source) in str(err.value) and "layers" in str(err.value) and time.perf_counter() - start < 20
    assert source.read_bytes() == before and listing(tmp_path) == {"bomb.gguf"}


@pytest.fixture(scope="module")
def text_adapter():
    from mmunlearn.adapters.text.adapter import TextLLMAdapter
    from tests.tiny import tiny_causal_lm, tiny_tokenizer

    return TextLLMAdapter(tiny_causal_lm(layers=1), tiny_tokenizer(), use_chat_template=False)


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 10000000000 }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
        "{{ 10 ** 100000000 }}",
        "{% for i in range(10000000000) %}x{% endfor %}",  # Jinja's own SecurityError: range too big
    ],
)
def test_a_chat_template_writing_gigabytes_is_one_error_naming_the_tokenizer(text_adapter, template):
    import copy

    tok = copy.copy(text_adapter.tokenizer)
    tok.chat_template = template
    tok.name_or_path = "/models/hostile"
    adapter = text_adapter.with_model(text_adapter.model)
    adapter.tokenizer, adapter.use_chat_template = tok, True
    start = time.perf_counter()
    with pytest.raises(USER_ERRORS) as err:
        adapter.prompt_text("Who wrote Hamlet?")
    assert "/models/hostile" in one_line(err.value) and "chat template" in one_line(err.value)
    assert time.perf_counter() - start < 20


def test_an_ordinary_chat_template_still_renders(text_adapter):
    import copy

    tok = copy.copy(text_adapter.tokenizer)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ '-' * 3 }}"
    adapter = text_adapter.with_model(text_adapter.model)
    adapter.tokenizer, adapter.use_chat_template = tok, True
    assert adapter.prompt_text("Who?") == "<user>Who?---"  # the control


def _corpus(root: Path) -> Path:
    gen = np.random.default_rng(0)
    for spk in ("alice", "bob", "carol"):
        for take in range(6):
            path = root / spk / f"session{take % 3}" / f"{take}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, (0.1 * gen.standard_normal(8000)).astype(np.float32), 16000)
    return root


def test_a_4_gib_sparse_wav_is_left_out_undecoded(tmp_path):
    from data_prep.fsdd import FOLDER_PATTERN, prepare_corpus

    root = _corpus(tmp_path / "corpus")
    bomb = root / "alice" / "session0" / "bomb.wav"
    sf.write(bomb, np.zeros(16, dtype=np.float32), 16000, subtype="PCM_16")
    with open(bomb, "r+b") as f:  # a header whose data chunk claims 4 GiB, the rest a hole in the file
        f.seek(40)
        f.write((0xFFFFFFF0).to_bytes(4, "little"))
        f.truncate(4 << 30)
    before = {str(p): p.stat().st_size for p in root.rglob("*")}  # sizes: hashing 4 GiB of hole is the slow part
    start = time.perf_counter()
    prepare_corpus(root, tmp_path / "out", pattern=FOLDER_PATTERN, forget_speakers=1, progress=False, allow_fewer=True)
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    (failed,) = report["failed"]
    assert failed["path"] == str(bomb) and "left out undecoded" in failed["reason"], report["failed"]
    assert time.perf_counter() - start < 60 and listing(tmp_path) == {"corpus", "out"}
    assert {str(p): p.stat().st_size for p in root.rglob("*")} == before


@pytest.mark.parametrize("value", ["inf", "1e308"])
def test_segment_seconds_that_is_no_length_is_one_error_line(tmp_path, value):
    root = _corpus(tmp_path / "corpus")
    before = digest_tree(root)
    res = run_cli_here(
        "voxceleb2",
        "prepare-corpus",
        "--root",
        str(root),
        "--out",
        str(tmp_path / "out"),
        "--corpus",
        "pattern",
        "--segment-seconds",
        value,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "--segment-seconds" in lines[0], res.stderr[-2000:]
    assert digest_tree(root) == before and listing(tmp_path) == {"corpus"}


@pytest.mark.parametrize("value", [".inf", "nan", "1e400"])
def test_crop_seconds_that_is_not_finite_is_a_config_error_naming_it(value):
    from recipes.recipe_config import ConfigError, build_config
    from recipes.voxceleb2.config import VoxCelebConfig

    with pytest.raises(ConfigError) as err:
        build_config(VoxCelebConfig, overrides=[f"crop_seconds={value}"])
    assert "crop_seconds" in one_line(err.value) and ("finite" in one_line(err.value) or value == "nan")


def test_reading_audio_at_0_hz_names_the_file(tmp_path):
    from mmunlearn.data.audio import read_audio

    sf.write(tmp_path / "a.wav", np.full(800, 0.1, dtype=np.float32), 8000)
    with pytest.raises(USER_ERRORS) as err:
        read_audio(tmp_path / "a.wav", 0)
    assert str(tmp_path / "a.wav") in one_line(err.value) and "0 Hz" in one_line(err.value)
