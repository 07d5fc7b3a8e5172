"""Checks of a Hugging Face ``save_pretrained`` folder (hf-audio, text) before transformers reads it, and of the model
it built: each refusal is one error naming the file and what is wrong (issue 33, low items).

Before loading (:func:`check_hf_folder`): the folder's links stay inside it and its weights are safetensors whose
headers read (:func:`mmunlearn.files.checkpoint.shard_files`: a folder with only ``pytorch_model.bin`` is refused with
the
convert hint, nothing is unpickled); ``config.json`` is a JSON object of at most 1 MiB; its ``attn_implementation``
names no Hub kernel (``"kernels-community/..."``: transformers would fetch and run code); it asks for no quantisation
(``quantization_config``: bitsandbytes and friends are not part of mmunlearn); no size in it is negative, it asks
for at most :data:`MAX_LAYERS` layers (100,000 tiny layers take hours to build) and the parameters it describes stay
under :data:`MAX_PARAMETERS`. While loading (:func:`loading`): transformers' own complaints (shapes that do not fit
the config, a missing library) become one error naming the folder. After loading (:func:`check_loaded`): NaN/Inf
weights.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from mmunlearn.files.checkpoint import shard_files

#: Largest ``config.json`` read (a real one is a few kB; the detectors read no more either).
MAX_CONFIG_BYTES = 1 << 20
#: Most parameters a config may describe (10^11: larger than any model this toolkit edits on one machine).
MAX_PARAMETERS = 10**11
#: Most layers a config may ask for (the deepest released models have about 130; 100,000 tiny layers take hours
#: to build while holding few parameters).
MAX_LAYERS = 1000
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers")
_WIDTH = ("hidden_size", "n_embd", "d_model")
_SIZE_SUFFIXES = ("_size", "_dim", "_layers", "_heads", "_embd", "n_layer", "n_head", "_positions")


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a JSON object of at most :data:`MAX_CONFIG_BYTES`, or a ValueError naming it."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (a save_pretrained folder holds its config.json)")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is {size:,} bytes, larger than the {MAX_CONFIG_BYTES:,} a model's config.json may be")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{path} is not a model config: nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a model config: not UTF-8 JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a model config: a JSON {type(config).__name__}, not an object")
    return config


def _sizes(config: dict[str, Any], path: Path, prefix: str = "", depth: int = 0) -> None:
    """Refuse a negative size (a key named like a size, or a list of them), also in nested configs."""
    for key, value in config.items():
        if isinstance(value, dict) and depth < 3:
            _sizes(value, path, f"{prefix}{key}.", depth + 1)
            continue
        if not (str(key).endswith(_SIZE_SUFFIXES) or str(key) in ("conv_dim", "conv_kernel", "conv_stride")):
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 for v in values):
            raise ValueError(f"{path}: {prefix}{key} is {value!r:.80}: a size cannot be negative")
        if str(key).endswith(("_layers", "n_layer")) and isinstance(value, (int, float)) and value > MAX_LAYERS:
            raise ValueError(
                f"{path}: {prefix}{key} is {value!r:.80}, more than the {MAX_LAYERS} layers mmunlearn "
                "builds: refusing before building it"
            )


def _first(config: dict[str, Any], keys: tuple[str, ...], default: float) -> float:
    for key in keys:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return default


def estimated_parameters(config: dict[str, Any]) -> float:
    """The parameters a transformer config describes, roughly: L (4 H^2 + 3 H I) + 2 V H (also of a nested
    ``text_config`` / ``audio_config`` / ..., summed). Infinite for a non-finite size."""
    total = 0.0
    for sub in [config] + [v for v in config.values() if isinstance(v, dict)]:
        width = _first(sub, _WIDTH, 0.0)
        layers, inner = _first(sub, _LAYERS, 0.0), _first(sub, ("intermediate_size", "n_inner", "ffn_dim"), 4 * width)
        total += layers * (4 * width * width + 3 * width * inner) + 2 * _first(sub, ("vocab_size",), 0.0) * width
    return total if math.isfinite(total) else math.inf


def check_sizes(config: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse a config (of the file ``path``) with a negative size, more than :data:`MAX_LAYERS` layers or more
    than :data:`MAX_PARAMETERS` estimated parameters, before anything is built from it."""
    _sizes(config, Path(path))
    params = estimated_parameters(config)
    if params > MAX_PARAMETERS:
        raise ValueError(
            f"{path} describes about {params:.3g} parameters (layers x hidden sizes), more than the "
            f"{MAX_PARAMETERS:.0e} mmunlearn loads: refusing before building it"
        )


#: The nested configs of a composite model (a speech LLM's text and audio parts): each must be a JSON object.
SUB_CONFIGS = (
    "text_config",
    "audio_config",
    "vision_config",
    "thinker_config",
    "talker_config",
    "encoder_config",
    "decoder_config",
    "llm_config",
)


def _attn(config: dict[str, Any], path: Path, prefix: str = "") -> None:
    """Refuse an ``attn_implementation`` naming a Hub kernel, at the top or in a nested config."""
    for key in ("attn_implementation", "_attn_implementation"):
        attn = config.get(key)
        if attn is not None and (not isinstance(attn, str) or "/" in attn or ":" in attn):
            raise ValueError(
                f"{path}: {prefix}{key} {attn!r:.80} names a Hub kernel or is not a name: kernels "
                "are code fetched from the Hub and are not run (use eager, sdpa or flash_attention_2)"
            )
    for name in SUB_CONFIGS:
        sub = config.get(name)
        if sub is not None and not isinstance(sub, dict):
            raise ValueError(f"{path}: {prefix}{name} is a JSON {type(sub).__name__}, not an object (a nested config)")
        if isinstance(sub, dict) and prefix.count(".") < 3:
            _attn(sub, path, f"{prefix}{name}.")


def check_config(folder: str | os.PathLike) -> dict[str, Any]:
    """``folder/config.json`` checked before transformers sees it: a JSON object of at most 1 MiB, no Hub kernel
    (also in nested configs, each an object), no quantisation, sizes in bounds (:func:`check_sizes`); returned."""
    path = Path(folder) / "config.json"
    config = read_config(Path(folder))
    _attn(config, path)
    if config.get("quantization_config") is not None:
        raise ValueError(
            f"{path} asks for a quantised model (quantization_config): mmunlearn edits full-precision "
            "weights; save the model unquantised"
        )
    check_sizes(config, path)
    return config


#: Bounds of a feature extractor's sizes (``preprocessor_config.json``): (smallest, largest). Whisper's are n_fft 400,
#: hop 160, 80 or 128 mel bins, 30 s chunks of 480,000 samples at 16 kHz.
FEATURE_BOUNDS = {
    "n_fft": (1, 1 << 14),
    "hop_length": (1, 1 << 14),
    "win_length": (1, 1 << 14),
    "feature_size": (1, 1024),
    "num_mel_bins": (1, 1024),
    "chunk_length": (1, 3600),
    "n_samples": (1, 3600 * 192_000),
    "nb_max_frames": (1, 3600 * 192_000),
    "sampling_rate": (1000, 192_000),
}


def check_preprocessor(folder: str | os.PathLike) -> None:
    """Refuse a ``preprocessor_config.json`` (when there is one) that is not a JSON object of at most 1 MiB or whose
    sizes lie outside :data:`FEATURE_BOUNDS` (``n_fft: 2**31`` would allocate gigabytes of filters), naming the key."""
    path = Path(folder) / "preprocessor_config.json"
    if not os.path.lexists(path):
        return
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: not a regular file of at most {MAX_CONFIG_BYTES:,} bytes")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{path} is not a feature extractor config: nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a feature extractor config: not UTF-8 JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a feature extractor config: a JSON {type(config).__name__}, not an object")
    for key, (low, high) in FEATURE_BOUNDS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(
                f"{path}: {key} is {value!r:.80}, outside {low}..{high}: refusing before the feature extractor is built"
            )


def check_hf_folder(folder: str | os.PathLike) -> dict[str, Any]:
    """Everything about a local ``save_pretrained`` folder that can be refused before transformers reads it (see the
    module docstring); returns its ``config.json``."""
    folder = Path(folder)
    config = check_config(folder)
    for shard in shard_files(folder):  # links, the safetensors-only rule, the index's names
        try:
            with safe_open(str(folder / shard), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"cannot read {folder / shard}: not a complete safetensors file ({exc})") from None
    return config


try:  # transformers validates configs with huggingface_hub's strict dataclasses (layer_types of another length)
    from huggingface_hub.errors import StrictDataclassError

    _CONFIG_ERRORS: tuple[type[BaseException], ...] = (StrictDataclassError,)
except ImportError:  # an older huggingface_hub: transformers raises ValueError, a user error already
    _CONFIG_ERRORS = ()


@contextmanager
def loading(folder: str | os.PathLike) -> Iterator[None]:
    """Turn what transformers raises on a folder it cannot build (weights that do not fit the config, a library
    the config needs, a damaged file) into one ValueError naming the folder."""
    try:
        yield
    except (RuntimeError, ImportError, OSError, SafetensorError, TypeError, *_CONFIG_ERRORS) as exc:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ValueError(f"{folder}: transformers cannot build the model from this folder ({text})") from None


def check_loaded(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Refuse a model whose weights hold NaN or Inf, naming the first such tensor and the folder."""
    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"{folder}: the weight {name} holds {bad} NaN/Inf value(s) of {tensor.numel()}: "
                "a damaged or hostile checkpoint"
            )


__all__ = [
    "FEATURE_BOUNDS",
    "MAX_CONFIG_BYTES",
    "MAX_LAYERS",
    "MAX_PARAMETERS",
    "SUB_CONFIGS",
    "check_config",
    "check_hf_folder",
    "check_preprocessor",
    "check_loaded",
    "check_sizes",
    "estimated_parameters",
    "loading",
    "read_config",
]
