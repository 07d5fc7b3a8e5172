"""Read a CTranslate2 ``model.bin`` into numpy arrays: the weights of a CTranslate2 model without CTranslate2.

Why by hand: no library reads this file into torch or numpy. The ``ctranslate2`` package loads it only into its
own C++ runtime (a ``Translator`` / ``Whisper`` object that runs the model, with no way to list or export its
weights), and its converters go the other way (from Hugging Face, OpenNMT, ... into ``model.bin``). The format is
small and documented by CTranslate2's serializer (``ModelSpec._serialize`` in its Python package), little-endian
throughout, binary version 6:

* ``uint32`` binary version, a string spec name (e.g. ``WhisperSpec``), ``uint32`` spec revision;
* ``uint32`` number of variables, then per variable: its name (string), ``uint8`` rank, ``uint32`` per dimension,
  ``uint8`` data type (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), ``uint32`` byte count, the
  raw row-major bytes;
* ``uint32`` number of aliases, then per alias two strings: the alias and the variable it names (a tied weight).

A string is a ``uint16`` length counting a terminating NUL byte, then that many UTF-8 bytes. Nothing here runs
code from the file: it is only sliced into arrays, every length checked against the bytes that remain.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: The binary versions whose layout this reader knows (the one every current CTranslate2 writes).
SUPPORTED_VERSIONS = (6,)
#: CTranslate2's DataType enum, in order; bfloat16 has no numpy type and is widened to float32 on reading.
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_NUMPY = {"float32": "<f4", "int8": "i1", "int16": "<i2", "int32": "<i4", "float16": "<f2", "bfloat16": "<u2"}


@dataclass
class Ct2Model:
    """The contents of a ``model.bin``: spec name and revision, the variables, the aliases (alias -> variable)."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> np.ndarray:
        """A variable by name, following an alias; KeyError naming the variable when absent."""
        target = self.aliases.get(name, name)
        if target not in self.variables:
            raise KeyError(f"CTranslate2 model has no variable {name!r}")
        return self.variables[target]

    def scalar(self, name: str) -> int:
        """A rank-0 integer variable (a flag or a count such as ``encoder/num_heads``)."""
        value = self.get(name)
        if value.ndim != 0 or value.dtype.kind not in "iu":
            raise ValueError(
                f"CTranslate2 variable {name!r}: expected an integer scalar, got {value.dtype} of shape {value.shape}"
            )
        return int(value)


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = memoryview(data), 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"{self.path}: truncated CTranslate2 model (reading {what} at byte {self.pos})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("H", what)
        raw = bytes(self.take(n, what))
        if n == 0 or raw[-1] != 0:
            raise ValueError(f"{self.path}: {what} is not a NUL-terminated string (byte {self.pos - n})")
        return raw[:-1].decode("utf-8")


def _array(reader: _Reader, name: str) -> tuple[np.ndarray, str]:
    (rank,) = reader.unpack("B", f"rank of {name}")
    shape = reader.unpack("I" * rank, f"shape of {name}") if rank else ()
    (type_id,) = reader.unpack("B", f"dtype of {name}")
    if type_id >= len(DTYPES):
        raise ValueError(f"{reader.path}: variable {name!r} has unknown data type id {type_id}")
    dtype = DTYPES[type_id]
    (nbytes,) = reader.unpack("I", f"size of {name}")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY[dtype]).itemsize
    if nbytes != expected:
        raise ValueError(
            f"{reader.path}: variable {name!r} of shape {list(shape)} and type {dtype} holds "
            f"{nbytes} bytes, expected {expected}"
        )
    array = np.frombuffer(reader.take(nbytes, f"data of {name}"), dtype=_NUMPY[dtype]).reshape(shape)
    if dtype == "bfloat16":  # the high half of a float32: shift the bits into place
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.copy(), dtype


def read_ct2_model(path: str | os.PathLike) -> Ct2Model:
    """Parse ``path`` (a ``model.bin``, or the folder holding it); ValueError on any layout it does not know."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.bin"
    if not path.is_file():
        raise FileNotFoundError(f"CTranslate2 model file not found: {path}")
    reader = _Reader(path.read_bytes(), path)
    (version,) = reader.unpack("I", "binary version")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{path}: CTranslate2 binary version {version}; this reader knows {SUPPORTED_VERSIONS}")
    model = Ct2Model(spec=reader.string("spec name"), revision=reader.unpack("I", "spec revision")[0])
    (count,) = reader.unpack("I", "variable count")
    for _ in range(count):
        name = reader.string("variable name")
        if name in model.variables:
            raise ValueError(f"{path}: variable {name!r} appears twice")
        model.variables[name], model.dtypes[name] = _array(reader, name)
    (count,) = reader.unpack("I", "alias count")
    for _ in range(count):
        alias, target = reader.string("alias"), reader.string("alias target")
        if target not in model.variables:
            raise ValueError(f"{path}: alias {alias!r} names the missing variable {target!r}")
        model.aliases[alias] = target
    if reader.pos != len(reader.data):
        raise ValueError(f"{path}: {len(reader.data) - reader.pos} unexpected bytes after the aliases")
    return model
