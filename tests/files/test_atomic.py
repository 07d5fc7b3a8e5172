"""mmunlearn.files.atomic: the temp-path context manager (suffix, permissions, cleanup) and its doctest."""

from __future__ import annotations

import doctest
import os

import pytest

import mmunlearn.files.atomic as atomic
from mmunlearn.files.atomic import atomic_path, write_bytes_atomic


def _names(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_atomic_path_keeps_the_suffix_and_replaces_the_target(tmp_path):
    target = tmp_path / "sub" / "plot.png"
    seen = []
    old = os.umask(0o022)
    try:
        with atomic_path(target) as tmp:
            seen.append(tmp)
            assert tmp.parent == target.parent and tmp.suffix == ".png" and tmp.name.startswith(".")
            assert tmp.is_file() and not target.exists()  # nothing at the target until the block ends
            tmp.write_bytes(b"new")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o644
    assert not seen[0].exists() and _names(target.parent) == {"plot.png"}


def test_atomic_path_failure_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = write_bytes_atomic(tmp_path / "w.safetensors", b"old")
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old" and _names(tmp_path) == {"w.safetensors"}


def test_atomic_path_writer_that_removes_its_file_fails_cleanly(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_path(tmp_path / "x.bin") as tmp:
            tmp.unlink()
    assert _names(tmp_path) == set()


def test_atomic_path_with_a_library_writer(tmp_path):
    torch = pytest.importorskip("torch")
    target = tmp_path / "state.pt"
    with atomic_path(target) as tmp:
        torch.save({"w": torch.arange(3)}, tmp)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(3))
    assert _names(tmp_path) == {"state.pt"}


def test_doctests():
    failed, attempted = doctest.testmod(atomic)
    assert attempted > 0 and failed == 0
