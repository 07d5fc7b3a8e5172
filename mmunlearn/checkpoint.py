"""Read and write HF ``save_pretrained`` checkpoints as state dicts, shard layout preserved.

Editing tools (erase, restore) work on the tensors of a checkpoint without instantiating the
model, so they apply to any architecture. Outputs are written to a temporary sibling directory
and renamed into place: an interrupted run leaves no partial output, and the input checkpoint
is never modified.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class Checkpoint:
    """Tensors of a checkpoint directory and the shard each one lives in."""

    root: Path
    tensors: dict[str, torch.Tensor]
    shard_of: dict[str, str]  # tensor name -> shard file name
    shard_meta: dict[str, dict]  # shard file name -> safetensors header metadata


def shard_files(root: Path) -> dict[str, list[str]]:
    """Shard file name -> tensor names, from the index file or the single safetensors file."""
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    if (root / INDEX).is_file():
        try:
            weight_map = json.loads((root / INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"{root / INDEX} is not a valid safetensors index (needs 'weight_map')") from exc
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        return shards
    if (root / SINGLE).is_file():
        with safe_open(str(root / SINGLE), framework="pt") as f:
            return {SINGLE: list(f.keys())}
    found = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (found {found}: convert to safetensors with save_pretrained(safe_serialization=True))" if found else ""
    raise FileNotFoundError(f"{root} has no {SINGLE} or {INDEX}{hint}")


def load_checkpoint(root: str | os.PathLike) -> Checkpoint:
    """Load every tensor of a safetensors checkpoint directory (CPU)."""
    root = Path(root)
    tensors: dict[str, torch.Tensor] = {}
    shard_of: dict[str, str] = {}
    shard_meta: dict[str, dict] = {}
    for shard, names in shard_files(root).items():
        try:
            with safe_open(str(root / shard), framework="pt") as f:
                shard_meta[shard] = f.metadata() or {}
                for name in names:
                    tensors[name] = f.get_tensor(name)
                    shard_of[name] = shard
        except (SafetensorError, FileNotFoundError) as exc:
            raise ValueError(f"cannot read shard {root / shard}: {exc}") from exc
    return Checkpoint(root=root, tensors=tensors, shard_of=shard_of, shard_meta=shard_meta)


@contextmanager
def atomic_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` only if the block completes."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"output directory already exists: {out} (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_checkpoint(ckpt: Checkpoint, out_dir: Path, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """Write ``ckpt`` (with ``tensors`` replacing its own) into ``out_dir`` in the same layout.

    Non-weight files (config, tokenizer, generation config, ...) are copied as they are.
    """
    tensors = dict(ckpt.tensors if tensors is None else tensors)
    weight_files = set(ckpt.shard_meta) | {INDEX}
    for item in ckpt.root.iterdir():
        if item.name in weight_files:
            continue
        if item.is_dir():
            shutil.copytree(item, out_dir / item.name)
        else:
            shutil.copy2(item, out_dir / item.name)
    for shard, meta in ckpt.shard_meta.items():
        part = {n: tensors[n].contiguous() for n, s in ckpt.shard_of.items() if s == shard}
        save_file(part, str(out_dir / shard), metadata=meta or {"format": "pt"})
    if (ckpt.root / INDEX).is_file():
        shutil.copy2(ckpt.root / INDEX, out_dir / INDEX)
