"""Storage of task matrices: parameter name -> tensor, plus metadata, as safetensors.

A task-matrix set is one ``.safetensors`` file, a directory of them (e.g. one file per layer
group), or a sharded file's ``*.safetensors.index.json``; the metadata (kind, data hash, steps, lr,
...) travels in the safetensors header as JSON. ``open_task_matrices`` reads headers only and
loads each tensor when asked for by name, so a large model's matrices can be streamed.

Files are untrusted: an index may only name plain files in its own folder, a link in a folder of task
matrices (or named by an index) must stay inside it, every task matrix must be real floating point
(float16, bfloat16, float32, float64), and a file that cannot be read is reported by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mmunlearn.files.atomic import atomic_path
from mmunlearn.files.paths import check_entry, check_tree, plain_name
from mmunlearn.taskvec.lowrank import LowRank

# safetensors header dtypes a task matrix may have (real floating point: float8 has no linear algebra in torch,
# and a complex matrix would lose its imaginary part), and torch's names of the others for the message
_FLOAT = ("F16", "BF16", "F32", "F64")
_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
    "C128": "complex128",
}


@dataclass
class TaskMatrices(Mapping):
    """A mapping ``layer_name -> tensor`` (or :class:`LowRank` factors, for LoRA) with metadata."""

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
    # a factored (LoRA) matrix is written dense: the file layout stays one tensor per parameter
    data = {k: (v.dense() if isinstance(v, LowRank) else v).detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(data, str(tmp), metadata={"mmunlearn": json.dumps(meta or {})})
    return path


def _files(path: Path) -> list[Path]:
    if path.is_file() and path.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except RecursionError:
            raise ValueError(f"{path} is not a valid safetensors index: nested too deeply") from None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"{path} is not a valid safetensors index (needs 'weight_map')") from exc
        files = [path.parent / plain_name(s, path) for s in shards]
        for f in files:
            check_entry(f, path.parent)  # a link named by the index stays in the index's folder
        return files
    if path.is_file():
        return [path]
    if path.is_dir():
        check_tree(path)  # no link out of the folder, no FIFO or device
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files of task matrices in {path}")
        return files
    raise FileNotFoundError(f"task matrices not found: {path}")


class LazyTaskMatrices(Mapping):
    """Task matrices on disk, read one tensor at a time by name (headers only at open).

    Iterates in the order of :func:`load_task_matrices` (files sorted by name, tensors in file
    order). Each lookup opens the file, so no memory map outlives the tensor it returned.
    """

    def __init__(self, path: str | os.PathLike, device: str = "cpu"):
        self.path, self.device = Path(path), device
        self.meta: dict = {}
        self._file_of: dict[str, Path] = {}
        self._shape: dict[str, tuple[int, ...]] = {}
        for f in _files(self.path):
            if not f.is_file():
                raise FileNotFoundError(f"task-matrix shard {f} listed in {self.path} not found")
            try:
                with safe_open(str(f), framework="pt") as st:
                    header = st.metadata() or {}
                    for key in st.keys():
                        if key in self._file_of:
                            raise ValueError(f"task matrix {key!r} appears twice (again in {f})")
                        dtype = st.get_slice(key).get_dtype()
                        if dtype not in _FLOAT:
                            raise ValueError(
                                f"task matrix {key} in {f} has dtype {_NAMES.get(dtype, dtype)}; "
                                "expected floating point (float16, bfloat16, float32 or float64)"
                            )
                        self._file_of[key] = f
                        self._shape[key] = tuple(st.get_slice(key).get_shape())
            except SafetensorError as exc:
                raise ValueError(f"{f} is not a readable safetensors file: {exc}") from exc
            if "mmunlearn" in header:
                try:
                    self.meta.update(json.loads(header["mmunlearn"]))
                except RecursionError:
                    raise ValueError(f"{f} has a malformed 'mmunlearn' metadata entry (nested too deeply)") from None
                except (json.JSONDecodeError, TypeError, ValueError) as exc:
                    raise ValueError(f"{f} has a malformed 'mmunlearn' metadata entry ({exc})") from exc
        if not self._file_of:
            raise ValueError(f"{path} holds no task matrices")

    def __getitem__(self, key: str) -> torch.Tensor:
        f = self._file_of[key]
        try:
            with safe_open(str(f), framework="pt", device=self.device) as st:
                return st.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"cannot read task matrix {key} from {f}: {exc}") from exc

    def __contains__(self, key: object) -> bool:  # Mapping's default would load the tensor
        return key in self._file_of

    def __iter__(self):
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)

    def shape(self, key: str) -> tuple[int, ...]:
        """Shape of a task matrix, from the file header (nothing loaded)."""
        return self._shape[key]


def open_task_matrices(path: str | os.PathLike, device: str = "cpu") -> LazyTaskMatrices:
    """Task matrices from a safetensors file, a directory of them or a sharded file's index,
    loaded lazily by name."""
    return LazyTaskMatrices(path, device)


def load_task_matrices(path: str | os.PathLike, device: str = "cpu") -> TaskMatrices:
    """Read task matrices from a safetensors file, a directory of them or a sharded file's index."""
    lazy = open_task_matrices(path, device)
    return TaskMatrices({key: lazy[key] for key in lazy}, dict(lazy.meta))
