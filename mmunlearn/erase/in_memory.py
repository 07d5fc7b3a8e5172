"""Erase and restore of checkpoint folders in memory (the counterpart of erase/stream.py):
load, edit, write atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mmunlearn.erase.apply import REPORT_NAME, erase, restore
from mmunlearn.erase.patch import UndoPatch
from mmunlearn.erase.report import EraseReport
from mmunlearn.erase.stream import LEFTOVERS, save_patch_apart
from mmunlearn.errors import NonFiniteError, about
from mmunlearn.files.checkpoint import atomic_dir, check_finite, check_output_dir, load_checkpoint, write_checkpoint
from mmunlearn.files.layout import PLOT_NAME
from mmunlearn.files.undo_store import default_undo_dir, patch_of
from mmunlearn.taskvec.store import load_task_matrices


def erase_checkpoint(
    model_dir: str | os.PathLike,
    forget: str | os.PathLike,
    out: str | os.PathLike,
    *,
    retain: str | os.PathLike | None = None,
    overwrite: bool = False,
    **options,
) -> EraseReport:
    """QR-Erase a checkpoint directory into ``out`` (edited weights + report + plot) and its undo patch into
    ``<out>.undo/`` beside it (:mod:`mmunlearn.files.undo_store`: ``out`` holds no original weights; its report's
    ``undo``
    entry names the undo folder, which ``overwrite`` replaces too).

    ``options`` are those of :func:`mmunlearn.erase.erase`. Everything is validated before
    anything is written, and ``out`` appears only once complete. ``out`` may not overlap an input
    (:func:`mmunlearn.files.checkpoint.check_output_dir`), and edited weights with NaN or Inf values are
    never written.
    """
    out = Path(out)
    inputs = (model_dir, forget, retain)
    check_output_dir(out, *inputs, overwrite=overwrite)
    check_output_dir(default_undo_dir(out), *inputs, out, overwrite=overwrite)  # before the work, not after it
    ckpt = load_checkpoint(model_dir)
    tf = load_task_matrices(forget)
    tr = load_task_matrices(retain) if retain is not None else None
    try:
        with about(f"model {model_dir}, forget {forget}" + (f", retain {retain}" if retain is not None else "")):
            report = erase(ckpt.tensors, tf, tr, out=None, **options)
    except NonFiniteError as exc:
        raise NonFiniteError(f"erase of {model_dir}: {exc}") from exc
    edited = {e.label.split("[", 1)[0] for e in report.patch.entries}
    check_finite({n: ckpt.tensors[n] for n in edited}, f"erase of {model_dir} into {out}")
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        write_checkpoint(ckpt, tmp)
        save_patch_apart(report, tmp, out, overwrite, inputs)  # into <out>.undo, never the released folder
        report.to_json(tmp / REPORT_NAME)
        report.plot_energy(tmp / PLOT_NAME)
    return report


def restore_checkpoint(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    patch: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> None:
    """Write the original checkpoint of an erased one into ``out`` (not an input, nor overlapping one); the undo
    patch is ``patch``, else the one in the undo folder ``model_dir``'s report names
    (:func:`mmunlearn.files.undo_store.patch_of`)."""
    model_dir = Path(model_dir)
    patch_path = Path(patch) if patch is not None else patch_of(model_dir)
    inputs = (model_dir, patch_path)
    check_output_dir(out, *inputs, overwrite=overwrite)
    ckpt = load_checkpoint(model_dir)  # first: a missing model folder is reported as such
    undo = UndoPatch.load(patch_path)
    with about(f"model {model_dir}, undo patch {patch_path}"):
        restore(ckpt.tensors, undo)
    restored = {e.label.split("[", 1)[0] for e in undo.entries}
    check_finite({n: ckpt.tensors[n] for n in restored}, f"restore of {model_dir} into {out}")
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        write_checkpoint(ckpt, tmp)
        for leftover in LEFTOVERS:
            path = tmp / leftover
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
