"""Parameter names as a saved model folder spells them, for undo patches that ``mmunlearn restore`` applies.

In memory a parameter may carry another prefix than on disk (a speech LLM's thinker holds
``model.language_model.layers.0...`` that ``save_pretrained`` writes as ``model.layers.0...``; a speaker
classifier's ``embedding_model.blocks...`` lives in ``embedding_model.ckpt`` under ``blocks...``). Rather
than rely on one library version's renaming rules, each edited tensor is matched to the on-disk tensor of
the same shape and the same bits, preferring the longest common name suffix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from mmunlearn.files.checkpoint import shard_files
from mmunlearn.kinds import Kind, kind_of


def _file_tensors(root: Path, kind: Kind) -> dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]]:
    out = {}
    for file in kind.weight_files:
        if not (root / file).is_file():
            continue
        state = kind.read_weights(root / file)  # the kind's safe reader (a checkpoint carrying code is refused)
        stem = file.rsplit(".", 1)[0]
        for key, t in state.items():
            out[f"{stem}.{key}"] = (tuple(t.shape), (lambda t=t: t))
    return out


def _safetensors_tensors(root: Path) -> dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]]:
    from safetensors import safe_open

    out = {}
    for shard, names in shard_files(root).items():
        with safe_open(str(root / shard), framework="pt") as f:
            for name in names:
                shape = tuple(f.get_slice(name).get_shape())
                out[name] = (shape, (lambda s=str(root / shard), n=name: _read(s, n)))
    return out


def _read(shard: str, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(shard, framework="pt") as f:
        return f.get_tensor(name)


def disk_tensors(root: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]]:
    """On-disk name -> (shape, loader) of a saved model folder: the weight files of its kind
    (:attr:`~mmunlearn.kinds.Kind.weight_files`, e.g. SpeechBrain ``.ckpt``), else safetensors shards."""
    root = Path(root)
    kind = kind_of(root)
    if kind is not None and kind.weight_files:
        return _file_tensors(root, kind)
    return _safetensors_tensors(root)


def _suffix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def disk_names(edited: Mapping[str, torch.Tensor], root: str | os.PathLike) -> dict[str, str]:
    """In-memory name -> on-disk name for each tensor of ``edited`` (its value as saved in ``root``).

    Candidates have the same shape; the best share the longest name suffix, then the most other name
    parts; the one whose bits equal the in-memory tensor wins. No match is an error naming the tensor.
    """
    on_disk = disk_tensors(root)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for key, (shape, _) in on_disk.items():
        by_shape.setdefault(shape, []).append(key)
    mapping: dict[str, str] = {}
    for name, value in edited.items():
        parts = name.split(".")
        ranked = sorted(
            by_shape.get(tuple(value.shape), []),
            reverse=True,
            key=lambda k: (_suffix(parts, k.split(".")), len(set(parts) & set(k.split(".")))),
        )
        cpu = value.detach().to("cpu")
        match = next(
            (k for k in ranked if _suffix(parts, k.split(".")) > 0 and torch.equal(on_disk[k][1](), cpu)), None
        )
        if match is None:
            raise ValueError(f"cannot find the edited tensor {name!r} {tuple(value.shape)} in the saved folder {root}")
        mapping[name] = match
    return mapping
