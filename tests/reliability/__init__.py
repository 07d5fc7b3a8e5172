"""Tests of how mmunlearn treats untrusted folders and bad input: refused early, inputs untouched, nothing written elsewhere."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree_hashes(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (symlinks as their target text), except under ``skip``."""
    out = {}
    for path in sorted(root.rglob("*")):
        if any(path == s or s in path.parents for s in skip):
            continue
        if path.is_symlink():
            out[str(path.relative_to(root))] = "link:" + str(path.readlink())
        elif path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[str(path.relative_to(root)) + "/"] = "dir"
    return out
