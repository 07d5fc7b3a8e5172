"""Storage of task matrices: parameter name -> tensor, plus metadata, as safetensors.

A task-matrix set is one ``.safetensors`` file, or a directory of them (e.g. one file per layer
group, so a large model's matrices can be streamed); the metadata (kind, data hash, steps, lr,
...) travels in the safetensors header as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file


@dataclass
class TaskMatrices(Mapping):
    """A mapping ``layer_name -> tensor`` with metadata."""

    tensors: dict[str, torch.Tensor]
    meta: dict = field(default_factory=dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def save_task_matrices(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], meta: dict | None = None) -> Path:
    """Write task matrices to one safetensors file atomically (temp file + rename)."""
    path = Path(path)
    if not tensors:
        raise ValueError("no task matrices to save")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        data = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        save_file(data, tmp, metadata={"mmunlearn": json.dumps(meta or {})})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files of task matrices in {path}")
        return files
    raise FileNotFoundError(f"task matrices not found: {path}")


def load_task_matrices(path: str | os.PathLike, device: str = "cpu") -> TaskMatrices:
    """Read task matrices from a safetensors file or a directory of them."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {}
    for f in _files(path):
        try:
            with safe_open(str(f), framework="pt", device=device) as st:
                header = st.metadata() or {}
                for key in st.keys():
                    if key in tensors:
                        raise ValueError(f"task matrix {key!r} appears twice (again in {f})")
                    tensors[key] = st.get_tensor(key)
        except SafetensorError as exc:
            raise ValueError(f"{f} is not a readable safetensors file: {exc}") from exc
        if "mmunlearn" in header:
            meta.update(json.loads(header["mmunlearn"]))
    if not tensors:
        raise ValueError(f"{path} holds no task matrices")
    return TaskMatrices(tensors, meta)
