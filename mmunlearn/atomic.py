"""Atomic file writes: a temporary sibling file, flushed, then renamed over the target.

A reader sees either the old file or the complete new one, never a partial write; a failed write
leaves no temporary file behind. The new file gets ordinary permissions (0o666 minus the umask).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (strict: NaN and Inf are refused) to ``path`` atomically; returns the path."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def _umask() -> int:
    """The process umask: from /proc where there is one (no side effect), else set and restored."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dir_mode() -> int:
    """The mode a new folder gets from ``mkdir``: 0o777 minus the umask (0o755 under the usual 022)."""
    return 0o777 & ~_umask()
