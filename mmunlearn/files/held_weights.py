"""What in a model folder may hold the original weights besides the model's own weight files: one notion for
``mmunlearn erase``, the unlearning harness, the speech-LLM copier and ``mmunlearn check-release``.

An edited model is only forgotten if nothing beside it still holds the weights it was edited from. A folder a user
brings often does: ``pytorch_model.bin`` next to ``model.safetensors``, Meta's ``original/consolidated.00.pth``, a
``.git/lfs/objects/...`` store, a backup ``model.safetensors.orig`` or ``model.orig.safetensors``, an undo patch or
undo folder copied under another name. :func:`weight_like` says so from a path (any part of it), :func:`weight_bytes`
from a file's first bytes (safetensors, torch zip, pickle, GGUF, NumPy, HDF5): the copiers leave such entries out of
what they write, and :func:`stray_weights` walks a whole folder (without following links) for ``check-release``.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path

from mmunlearn.files.layout import HISTORY_DIR

#: File-name extensions (any dot-separated part after the first, so ``model.safetensors.orig`` counts) of formats
#: that store tensors.
WEIGHT_EXTENSIONS = frozenset(
    {
        "safetensors",
        "bin",
        "pt",
        "pth",
        "ckpt",
        "gguf",
        "ggml",
        "npz",
        "npy",
        "h5",
        "hdf5",
        "msgpack",
        "onnx",
        "tflite",
        "pkl",
        "pickle",
        "joblib",
        "nemo",
        "keras",
        "pb",
        "ot",
        "mlmodel",
        "tar",
        "zip",
    }
)
#: Folders whose every file may be a copy of the weights: git's object store (LFS keeps the files' bytes there), a
#: request history, an undo folder under any name ending ``.undo``.
WEIGHT_FOLDERS = frozenset({".git", HISTORY_DIR})
#: Names that end in a weight extension yet hold no weights: indexes, and Qwen2.5-Omni's voice table ``spk_dict.pt``
#: (the talker's speaker embeddings, not weights any method edits; copied so the folder loads as the one read).
NOT_WEIGHTS = frozenset({"spk_dict.pt"})
_INDEX_ENDINGS = (".index.json",)
_SNIFF = 64


def weight_like(rel: str | os.PathLike) -> bool:
    """Whether the entry at ``rel`` (a path relative to the model folder) may hold weights by its name: a weight
    extension anywhere in its name, or any folder on its path in :data:`WEIGHT_FOLDERS` or ending ``.undo``."""
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts:
        return False
    if any(p in WEIGHT_FOLDERS or p.lower().endswith(".undo") for p in parts):
        return True
    name = parts[-1].lower()
    if name in NOT_WEIGHTS or name.endswith(_INDEX_ENDINGS):
        return False
    return any(ext in WEIGHT_EXTENSIONS for ext in name.split(".")[1:])


def weight_bytes(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first 64 bytes) is stored tensors whatever its name: a safetensors
    header, a torch zip or any zip, a pickle, GGUF, a NumPy array or HDF5."""
    if head.startswith((b"PK\x03\x04", b"GGUF", b"\x93NUMPY", b"\x89HDF\r\n\x1a\n")):
        return True
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # pickle protocol 2..5
        return True
    if len(head) >= 10:
        (size,) = struct.unpack("<Q", head[:8])
        return 2 <= size < (1 << 30) and head[8:10] in (b'{"', b"{ ", b"{\n")
    return False


def held_in(rel: str | os.PathLike, head: bytes) -> bool:
    """Whether the file at ``rel`` whose first bytes are ``head`` may hold weights: by its name (:func:`weight_like`),
    else by its bytes (:func:`weight_bytes`), unless its name is one of :data:`NOT_WEIGHTS` or an index."""
    if weight_like(rel):
        return True
    name = Path(rel).name.lower()
    return name not in NOT_WEIGHTS and not name.endswith(_INDEX_ENDINGS) and weight_bytes(head)


def _head(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.pread(fd, _SNIFF, 0)
    finally:
        os.close(fd)


def stray_weights(folder: str | os.PathLike, live: Iterable[str] = ()) -> list[str]:
    """Every entry under ``folder`` (relative paths, sorted; links not followed, a link judged by its own and its
    target's names) that may hold weights and is not one of ``live``, the model's own weight files: by name
    (:func:`weight_like`, a weight folder reported once) or by content (:func:`weight_bytes`)."""
    root = Path(folder)
    live = {os.path.normpath(n) for n in live}
    found: list[str] = []
    for base, dirs, files in os.walk(root, followlinks=False):
        rel_base = os.path.relpath(base, root)
        for d in list(dirs):
            rel = os.path.normpath(os.path.join(rel_base, d))
            if weight_like(rel):  # a weight folder is reported once, not walked
                found.append(rel + "/")
                dirs.remove(d)
        for f in files:
            rel = os.path.normpath(os.path.join(rel_base, f))
            if rel in live:
                continue
            path = root / rel
            if path.is_symlink():
                if weight_like(rel) or weight_like(os.readlink(path)):
                    found.append(rel)
            elif weight_like(rel) or held_in(rel, _head(path)):
                found.append(rel)
    return sorted(found)


__all__ = [
    "NOT_WEIGHTS",
    "WEIGHT_EXTENSIONS",
    "WEIGHT_FOLDERS",
    "held_in",
    "stray_weights",
    "weight_bytes",
    "weight_like",
]
