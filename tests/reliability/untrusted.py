"""Small hand-built safetensors checkpoints, task matrices and hostile files for the reliability tests.

Nothing here downloads anything or builds a transformers model: a checkpoint is a few 8 x 6 float32
matrices named like decoder-block weights, in three shards with an index (or one file).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from mmunlearn.taskvec import save_task_matrices

INDEX = "model.safetensors.index.json"
ROOT = Path(__file__).resolve().parents[2]


def weight_names(layers: int = 3) -> list[str]:
    return [f"model.layers.{i}.mlp.{p}.weight" for i in range(layers) for p in ("up_proj", "down_proj")]


def make_checkpoint(
    root: Path, layers: int = 3, sharded: bool = True, dtype: torch.dtype = torch.float32, index: dict | None = None
) -> Path:
    """A checkpoint folder (config.json, one shard per layer + index, or model.safetensors); ``index``
    replaces the index's weight_map (for hostile indexes)."""
    root.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(8, 6, generator=g).to(dtype) for n in weight_names(layers)}
    (root / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    if not sharded:
        save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
        return root
    weight_map = {}
    for i in range(layers):
        shard = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        part = {n: t for n, t in tensors.items() if f".layers.{i}." in n}
        save_file(part, str(root / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": index if index is not None else weight_map}))
    return root


def make_forget(
    path: Path, layers: int = 3, hot: int = 2, scale: float = 0.05, dtype: torch.dtype = torch.float32
) -> Path:
    """Forget task matrices for every weight; layer ``hot`` carries most of the energy."""
    g = torch.Generator().manual_seed(1)
    tm = {
        n: (scale * (8.0 if f".layers.{hot}." in n else 1.0) * torch.randn(8, 6, generator=g)).to(dtype)
        for n in weight_names(layers)
    }
    return save_task_matrices(path, tm)


def digest_tree(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (links not followed: a link is hashed by its target name)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def write_pickle_bomb(path: Path, marker: Path) -> Path:
    """A pickle whose unpickling creates ``marker`` (what torch.load(weights_only=False) would run)."""

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path.write_bytes(pickle.dumps({"weight": Bomb()}))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python -m mmunlearn.cli ARGS`` in a subprocess (the console entry point, not CliRunner)."""
    full_env = {k: v for k, v in os.environ.items() if k != "MMUNLEARN_DEBUG"}
    full_env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "mmunlearn.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full_env,
        timeout=timeout,
    )


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """The console entry point ``mmunlearn.cli.main(ARGS)`` run in this process (from the repository root, with
    MMUNLEARN_DEBUG unset), its exit status and both streams captured: the same error path as :func:`run_cli`
    without a new interpreter's start-up (about 4 s each on the CI machine). ``test_cli_errors`` keeps a real process
    for the console entry itself."""
    from mmunlearn.cli import main

    out, err, code, cwd = io.StringIO(), io.StringIO(), 0, os.getcwd()
    debug = os.environ.pop("MMUNLEARN_DEBUG", None)
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        os.chdir(cwd)
        if debug is not None:
            os.environ["MMUNLEARN_DEBUG"] = debug
    return subprocess.CompletedProcess(["mmunlearn", *args], code, out.getvalue(), err.getvalue())
