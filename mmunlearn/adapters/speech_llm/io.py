"""Speech-LLM directories in ``save_pretrained`` layout: read (thinker-only or full Omni model) and write.

A directory holds ``config.json`` + safetensors weights, the tokenizer files (with the chat
template) and ``preprocessor_config.json`` (the Whisper feature extractor), or a full processor
(``processor_config.json`` / ``chat_template.*`` next to them) as the hub checkpoints ship it.
The processor is used when transformers can build it from the directory; otherwise the tokenizer
and feature extractor are read on their own (directories written here, or processors whose image
or video parts cannot be built on this machine).

The folder is untrusted: before anything is read, links leaving it, special files and hard-linked side
files are refused (:func:`check_folder`), and only safetensors weights are loaded (a folder with pickled
``pytorch_model.bin`` only is refused with a hint). Side files are carried into a written folder by one
walk that never follows a link (:func:`mmunlearn.files.safecopy.copy_side_files`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from mmunlearn.adapters.base import resolve_device, resolve_dtype
from mmunlearn.adapters.hf_checks import check_config, check_preprocessor, loading
from mmunlearn.adapters.speech_llm.families import family_of_dir
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.files.layout import RESERVED
from mmunlearn.files.paths import check_tree
from mmunlearn.files.safecopy import check_side_files, copy_side_files

log = logging.getLogger(__name__)


def _processor(path: Path):
    """The directory's processor if transformers can build it with a tokenizer and a feature extractor."""
    from transformers import AutoProcessor

    try:
        proc = AutoProcessor.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any failure means "use tokenizer + feature extractor"
        log.info(
            "no usable processor in %s (%s: %s); reading tokenizer and feature extractor", path, type(exc).__name__, exc
        )
        return None
    if getattr(proc, "tokenizer", None) is None or getattr(proc, "feature_extractor", None) is None:
        return None
    return proc


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt.index.json", ".safetensors.index.json", ".bin.index.json")
_PICKLED = (".bin", ".pt", ".pth")


def _side_file(name: str) -> bool:
    return not name.endswith(_WEIGHT_SUFFIXES)


def check_folder(root: Path) -> None:
    """Refuse a speech-LLM folder holding a link that leaves it, a special file or a hard-linked side file
    (what :func:`save_dir` would copy), or whose weights are pickled only; every error names the file."""
    if not root.is_dir():
        raise FileNotFoundError(f"speech-LLM directory not found: {root}")
    check_tree(root)
    check_side_files(root, select=_side_file, folders=False)
    check_config(root)  # no Hub kernel, no quantisation, nested configs objects, sizes in bounds: before transformers
    check_preprocessor(root)
    names = [p.name for p in root.iterdir()]
    if not any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        pickled = sorted(n for n in names if n.endswith(_PICKLED))
        hint = (
            (
                f" (found {pickled}: convert to safetensors with save_pretrained(safe_serialization=True); "
                "mmunlearn never unpickles weights from a model folder)"
            )
            if pickled
            else ""
        )
        raise FileNotFoundError(f"{root} has no safetensors weights (model.safetensors or an index){hint}")


def load_dir(path: str | os.PathLike, *, device: str = "auto", dtype: str | torch.dtype = "auto"):
    """(thinker model, full container or None, tokenizer, feature extractor, processor or None, family)."""
    from transformers import AutoFeatureExtractor, AutoTokenizer

    root = Path(path)
    check_folder(root)
    family, full = family_of_dir(root)
    dev = resolve_device(device)
    with loading(root):  # what transformers refuses in the config (layer_types of another length): one error
        # a full Omni container's own from_pretrained cannot return the loading info (it loads its voices after)
        loaded = family.model_cls(full).from_pretrained(
            str(root), dtype=resolve_dtype(dtype, dev), **({} if full else {"output_loading_info": True})
        )
    loaded, info = (loaded, {}) if full else loaded
    missing = sorted(info.get("missing_keys", ())) + sorted(str(k) for k in info.get("mismatched_keys", ()))
    if missing:  # e.g. config.json asking for more layers than the weights hold: those would be random
        raise ValueError(
            f"{root}: the weights do not fill the model config.json describes: {len(missing)} tensor(s) "
            f"missing or of another shape (e.g. {', '.join(missing[:3])}); they would be random"
        )
    loaded = loaded.to(dev).eval()
    container, model = (loaded, loaded.thinker) if full else (None, loaded)
    processor = _processor(root)
    if processor is not None:
        tokenizer, fe = processor.tokenizer, processor.feature_extractor
    else:
        if not (root / "preprocessor_config.json").is_file():
            raise FileNotFoundError(f"{root} has no preprocessor_config.json (the audio feature extractor)")
        with loading(root):  # a tokenizer.json nested 100,000 deep is one error naming the folder
            tokenizer = AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
            fe = AutoFeatureExtractor.from_pretrained(str(root), trust_remote_code=False)
    return model, container, tokenizer, fe, processor, family


def _copy_side_files(source: Path, out: Path) -> None:
    """Top-level files of the source directory that ``save_pretrained`` does not write (e.g. Qwen2.5-Omni's
    ``spk_dict.pt`` voice table, a README), so the written directory loads like the one read. One walk that
    never follows a link out of ``source`` and refuses hard links (:mod:`mmunlearn.files.safecopy`). What may hold the
    original weights (:mod:`mmunlearn.files.held_weights`: ``consolidated.pth``, ``model.safetensors.orig``, any file
    whose bytes are stored tensors) is left out, with a warning naming it."""
    dropped = copy_side_files(
        source,
        out,
        select=lambda name: (
            _side_file(name) and not os.path.lexists(out / name) and name not in RESERVED
        ),  # ours: not copied
        folders=False,
        drop_weights=True,
    )
    if dropped:
        log.warning(
            "%s: left out of the output, as they may hold the original weights: %s", source, ", ".join(dropped[:10])
        )


def save_dir(adapter, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write the adapter's model (its container when it has one) and processor parts, atomically."""
    with atomic_dir(path, overwrite=overwrite) as tmp:
        (adapter.container or adapter.model).save_pretrained(tmp)
        if adapter.processor is not None:
            adapter.processor.save_pretrained(tmp)
        else:
            if adapter.chat_template and not getattr(adapter.tokenizer, "chat_template", None):
                adapter.tokenizer.chat_template = adapter.chat_template
            adapter.tokenizer.save_pretrained(tmp)
            adapter.feature_extractor.save_pretrained(tmp)
        source = getattr(adapter, "source_dir", None)
        if source is not None and Path(source).is_dir():
            _copy_side_files(Path(source), tmp)
    return Path(path)
