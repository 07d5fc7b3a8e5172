"""Read and write HF ``save_pretrained`` checkpoints as state dicts, shard layout preserved.

Editing tools (erase, restore) work on the tensors of a checkpoint without instantiating the
model, so they apply to any architecture. Outputs are written to a temporary sibling directory
and renamed into place: an interrupted run leaves no partial output, and the input checkpoint
is never modified. Model folders are untrusted: shard names must be plain names, symbolic links
must stay inside the folder, and an output may not overlap an input (see :mod:`mmunlearn.files.paths`).
Only safetensors files are read; pickled ``.bin`` / ``.pt`` weights are never loaded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mmunlearn._version import __version__
from mmunlearn.errors import NonFiniteError, writing
from mmunlearn.files.atomic import dir_mode, file_mode, terminate_raises, write_json_atomic
from mmunlearn.files.layout import MARKER, RESERVED, check_not_reserved
from mmunlearn.files.paths import (
    check_output_dir,
    check_tree,
    clean_leftovers,
    make_temp_dir,
    plain_name,
)
from mmunlearn.files.safecopy import check_side_files, copy_side_files

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
__all__ = [
    "INDEX",
    "MARKER",
    "SINGLE",
    "Checkpoint",
    "atomic_dir",
    "check_finite",
    "check_output_dir",
    "copy_extra_files",
    "load_checkpoint",
    "save_shard",
    "shard_files",
    "write_checkpoint",
]

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    """Tensors of a checkpoint directory and the shard each one lives in."""

    root: Path
    tensors: dict[str, torch.Tensor]
    shard_of: dict[str, str]  # tensor name -> shard file name
    shard_meta: dict[str, dict]  # shard file name -> safetensors header metadata


def _read_index(path: Path) -> dict[str, str]:
    """The ``weight_map`` of a safetensors index: tensor name -> plain shard file name, none of them a name
    an output folder uses for its own files (:mod:`mmunlearn.files.layout`)."""
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except RecursionError:
        raise ValueError(f"{path} is not a valid safetensors index: nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a valid safetensors index (needs 'weight_map')") from exc
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
        raise ValueError(f"{path} is not a valid safetensors index ('weight_map' must map tensor names to files)")
    for shard in weight_map.values():
        check_not_reserved(plain_name(shard, path), path)
    return weight_map


def shard_files(root: Path) -> dict[str, list[str]]:
    """Shard file name -> tensor names, from the index file or the single safetensors file.

    Checks the folder first (:func:`mmunlearn.files.paths.check_tree`: no link leaving it), every shard name of
    the index (a plain name inside the folder, not a name outputs use), and the other files as they will
    be copied (:func:`mmunlearn.files.safecopy.check_side_files`: no hard link), before any shard is opened.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    check_tree(root)
    if (root / INDEX).is_file():
        shards: dict[str, list[str]] = {}
        for name, shard in _read_index(root / INDEX).items():
            shards.setdefault(shard, []).append(name)
        check_side_files(root, skip=shards)
        return shards
    if (root / SINGLE).is_file():
        try:
            with safe_open(str(root / SINGLE), framework="pt") as f:
                names = list(f.keys())
        except SafetensorError as exc:
            raise ValueError(f"cannot read {root / SINGLE}: not a valid safetensors file ({exc})") from exc
        check_side_files(root, skip={SINGLE})
        return {SINGLE: names}
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


def _write_marker(folder: Path) -> None:
    """The marker that lets ``overwrite`` replace this folder later. No timestamp (the folder's mtime
    has it): two runs that write the same output give byte-identical folders."""
    write_json_atomic(folder / MARKER, {"tool": "mmunlearn", "version": __version__})


@contextmanager
def atomic_dir(
    out: str | os.PathLike, overwrite: bool = False, inputs: Iterable[str | os.PathLike | None] = ()
) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` only if the block completes.

    ``out`` is checked first with :func:`check_output_dir` against ``inputs`` (never one of them,
    inside or above one; replaced only with ``overwrite`` and only if mmunlearn wrote it), and
    temporary folders that killed runs left next to it are removed. The finished folder holds the
    marker file :data:`MARKER` and has ordinary permissions (0o777 minus the umask). SIGTERM while the
    block runs removes the temporary folder, as Ctrl-C does (:func:`mmunlearn.files.atomic.terminate_raises`).
    """
    inputs = tuple(inputs)
    out = check_output_dir(out, *inputs, overwrite=overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out)
    with terminate_raises():  # SIGTERM cleans up as SIGINT does (the finally below runs)
        tmp = make_temp_dir(out, "tmp")
        try:
            yield tmp
            _write_marker(tmp)
            os.chmod(tmp, dir_mode())
            check_output_dir(out, *inputs, overwrite=overwrite)  # again: another process may have written it
            if os.path.lexists(out):
                old = make_temp_dir(out, "old")
                os.replace(out, old / "x")
                os.replace(tmp, out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def check_finite(named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    """Raise :class:`~mmunlearn.errors.NonFiniteError` if a floating-point tensor holds NaN or Inf.

    ``where`` says what was about to happen (e.g. ``"erase into out/"``); the message names the
    first bad tensor and how many of its entries are not finite. Costs one norm per tensor.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    for name, t in items:
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            continue
        t = t.detach()
        if math.isfinite(float(torch.linalg.vector_norm(t))):
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise NonFiniteError(
                f"{where}: {name} would hold {bad} NaN/Inf value(s) of {t.numel()}; nothing was "
                "written (a --scale too large for the weights' dtype, or corrupt inputs)"
            )


def copy_extra_files(
    root: str | os.PathLike, dst: str | os.PathLike, skip: Iterable[str] = (), *, weights: bool = False
) -> list[str]:
    """Copy everything in ``root`` but the names in ``skip`` and those outputs use for their own files
    (:data:`mmunlearn.files.layout.RESERVED`: an input's ``unlearn_report.json``, ``undo_history/`` or ``tilt/`` would
    be
    read back as ours) into ``dst``. Unless ``weights``, whatever may hold weights (:mod:`mmunlearn.files.held_weights`:
    ``pytorch_model.bin`` beside the safetensors, ``original/*.pth``, ``.git/``, backups) is left out, with a warning
    naming it: an edited model must not carry the weights it was edited from. Returns what was left out.

    One walk that opens every entry without following links and copies from what it opened
    (:func:`mmunlearn.files.safecopy.copy_side_files`): a link leaving the folder, a hard link or an entry
    replaced while being copied is refused; a file link inside is copied as its file, a folder link
    inside ``root`` is kept as a relative link. The links are also checked before anything is copied
    (:func:`mmunlearn.files.paths.check_tree`), so a folder that was bad from the start writes nothing.
    """
    check_tree(root)
    dropped = copy_side_files(root, dst, skip=set(skip) | RESERVED, drop_weights=not weights)
    if dropped:
        log.warning(
            "%s: left out of the output, as they may hold the original weights: %s",
            root,
            ", ".join(dropped[:10]) + (f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""),
        )
    return dropped


def save_shard(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict | None, shown: str | os.PathLike | None = None
) -> None:
    """Write one safetensors shard with ordinary permissions (0o666 minus the umask, as every other output;
    safetensors itself creates 0o600 files); a full disk or file-size limit is reported naming ``shown``."""
    with writing(path, shown):
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(path), metadata=metadata or {"format": "pt"})
    os.chmod(path, file_mode())


def write_checkpoint(ckpt: Checkpoint, out_dir: Path, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
    """Write ``ckpt`` (with ``tensors`` replacing its own) into ``out_dir`` in the same layout.

    Non-weight files (config, tokenizer, generation config, ...) are copied as they are
    (:func:`copy_extra_files`).
    """
    tensors = dict(ckpt.tensors if tensors is None else tensors)
    copy_extra_files(ckpt.root, out_dir, skip=set(ckpt.shard_meta))  # the index too, through the same walk
    for shard, meta in ckpt.shard_meta.items():
        part = {n: tensors[n] for n, s in ckpt.shard_of.items() if s == shard}
        save_shard(part, out_dir / plain_name(shard, ckpt.root / INDEX), meta)
