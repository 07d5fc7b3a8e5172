"""``mmunlearn restore`` for every output folder: the original weights back, bit for bit, in a new folder.

Handles what ``mmunlearn erase`` writes (safetensors, streamed shard by shard or in memory) and what the
unlearning harness writes for any method and model kind: safetensors models (text and speech LLMs, Hugging Face
audio classifiers), kinds whose weights are state-dict files (:attr:`~mmunlearn.kinds.Kind.weight_files`: SpeechBrain
speaker classifiers' ``.ckpt``, read with ``weights_only=True``) and the outputs of methods that make a head
instead of editing weights (T3: the unchanged model in its ``base/``, without the ``tilt/`` head). Reports, plots
and the undo patch are not carried into the restored folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mmunlearn.erase.apply import PATCH_NAME, restore
from mmunlearn.erase.in_memory import restore_checkpoint
from mmunlearn.erase.patch import UndoPatch
from mmunlearn.erase.stream import stream_restore_checkpoint
from mmunlearn.files.checkpoint import MARKER, atomic_dir, check_output_dir, copy_extra_files
from mmunlearn.files.undo_store import UNDO_KEY, read_release_report, split_undo, undo_dir_of
from mmunlearn.kinds import Kind, kind_of
from mmunlearn.methods import REGISTRY, model_folder
from mmunlearn.methods.harness import REPORT_NAME, restore_leftovers
from mmunlearn.requests.history import read_history, step_back


def _no_weight_edited(report: dict) -> bool:
    """Whether the harness report's method makes a head, not weights (T3): its folder holds the unchanged model. A
    report of a weight-editing method saying ``changed_fraction: 0`` is not taken on its word (a tampered report
    would have restore hand out the edited weights as the original): without an undo patch there is nothing to
    restore."""
    method = REGISTRY.get(str(report.get("method")))
    return method is not None and not method.edits_weights


def _restore_files(model_dir: Path, out: Path, undo: UndoPatch, kind: Kind, overwrite: bool) -> None:
    """Restore a folder whose weights are state-dict files (:attr:`~mmunlearn.kinds.Kind.weight_files`)."""
    if kind.check_folder is not None:
        kind.check_folder(model_dir)  # its side files are carried over as they are: checked first
    states = {f: kind.read_weights(model_dir / f) for f in kind.weight_files if (model_dir / f).is_file()}
    flat = {f"{f.rsplit('.', 1)[0]}.{k}": t for f, s in states.items() for k, t in s.items()}
    restore(flat, undo)  # writes into the loaded tensors
    with atomic_dir(out, overwrite=overwrite, inputs=(model_dir,)) as tmp:
        copy_extra_files(model_dir, tmp, set(restore_leftovers()) | set(states), weights=True)  # its own .ckpt
        for f, state in states.items():
            kind.write_weights(state, tmp / f)  # the kind's own format


def restore_folder(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    patch: str | os.PathLike | None = None,
    overwrite: bool = False,
    stream: bool = True,
    hardlink: bool = True,
    progress: bool = True,
    steps: int = 1,
) -> Path:
    """Undo the latest request of an unlearning output ``model_dir`` into ``out``.

    A folder edited by several requests (``undo_history/``, :mod:`mmunlearn.requests.history`) gives the
    folder the request before wrote: its weights bit for bit, its undo patch, report and history.
    ``steps`` undoes that many requests at once (0: all of them, back to the original model).
    """
    model_dir, out = Path(model_dir), Path(out)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a whole number >= 0 (0: every request), got {steps!r}")
    depth = read_history(model_dir).depth if patch is None and model_dir.is_dir() else 0
    if depth < 2 and steps in (0, 1):
        return _restore_one(model_dir, out, patch, overwrite, stream, hardlink, progress)
    count = depth if steps == 0 else steps
    if patch is not None or count > depth:
        raise ValueError(
            f"{model_dir} records {depth} request(s); cannot undo {count}"
            + (" with --patch (one patch undoes one request)" if patch is not None else "")
        )
    check_output_dir(out, model_dir, overwrite=overwrite)
    with atomic_dir(out, overwrite=overwrite, inputs=(model_dir,)) as tmp:
        src = model_dir
        for i in range(count):
            stage = tmp / f".step-{i}"
            _restore_one(src, stage, None, False, stream, hardlink, progress)
            step_back(src, stage)  # the folder the request before wrote
            src = stage
        for item in list(src.iterdir()):
            if item.name != MARKER:
                os.replace(item, tmp / item.name)
        for i in range(count):
            shutil.rmtree(tmp / f".step-{i}", ignore_errors=True)
        _keep_undo_apart(tmp, out, overwrite, model_dir)
    return out


def _keep_undo_apart(staging: Path, out: Path, overwrite: bool, model_dir: Path) -> None:
    """The undo records a restored earlier request carries (its patch, its history) moved to ``<out>.undo`` and its
    report pointed there, so the restored folder holds no original weights either."""
    ref = split_undo(staging, out.resolve(), overwrite=overwrite, inputs=(model_dir,))
    report_path = staging / REPORT_NAME
    if ref is not None and report_path.is_file():
        report = json.loads(report_path.read_text())
        report[UNDO_KEY] = ref
        report_path.write_text(json.dumps(report, indent=2))


def _restore_one(
    model_dir: Path,
    out: Path,
    patch: str | os.PathLike | None,
    overwrite: bool,
    stream: bool,
    hardlink: bool,
    progress: bool,
) -> Path:
    """Undo one patch of ``model_dir`` into ``out`` (any kind, any method)."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder not found: {model_dir}")
    undo = undo_dir_of(model_dir) if patch is None else None  # kept apart from the model (mmunlearn.files.undo_store)
    patch_path = Path(patch) if patch is not None else (undo if undo is not None else model_dir) / PATCH_NAME
    check_output_dir(out, model_dir, patch_path, overwrite=overwrite)  # never the input, inside it or above it
    report = read_release_report(model_dir) or {}  # at most 64 MiB, no link followed, a special file refused
    if not patch_path.is_file() and report and _no_weight_edited(report):
        with atomic_dir(out, overwrite=overwrite, inputs=(model_dir,)) as tmp:  # nothing was edited (T3): no head
            copy_extra_files(model_folder(model_dir), tmp, set(restore_leftovers()), weights=True)  # T3: base/
        return out
    if not patch_path.is_file():
        said = (
            " (its report says no weight changed: then the folder is the input as it was)"
            if report.get("changed_fraction") == 0.0
            else ""
        )
        raise FileNotFoundError(f"undo patch not found: {patch_path} (pass --patch){said}")
    kind = kind_of(model_dir)
    if kind is not None and kind.weight_files:
        _restore_files(model_dir, out, UndoPatch.load(patch_path), kind, overwrite)
    elif stream:
        stream_restore_checkpoint(
            model_dir, out, patch=patch_path, overwrite=overwrite, hardlink=hardlink, progress=progress
        )
    else:
        restore_checkpoint(model_dir, out, patch=patch_path, overwrite=overwrite)
    return out
