"""Where an output's undo records live: a private folder beside the released model, never inside it.

An undo patch holds the original values of every tensor an edit changed (``mmunlearn restore`` needs them to give the
input back bit for bit), so a model folder that carried it would ship what was forgotten. The harness, restore and
``mmunlearn erase`` therefore move ``undo_patch.safetensors`` and ``undo_history/`` out of the folder they write into
an undo folder (default ``<out>.undo`` beside it, or a path the caller names), readable by its owner only (mode 0700),
and record where in the output's ``unlearn_report.json`` (``erase_report.json`` for ``mmunlearn erase``)::

    "undo": {"folder": "ecapa_unlearned.undo", "id": "<random id>"}

``folder`` is relative to the output's parent folder when the undo folder lies beside it (a moved pair still
resolves), else absolute; the undo folder's ``undo.json`` repeats ``id``, so a report cannot point restore at a folder
(or file) that is not its own. :func:`undo_dir_of` finds the records of a folder (an older output that still holds
them inside is read as it is); :func:`release_problems` says why a folder is not ready to ship.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from mmunlearn.atomic import write_json_atomic
from mmunlearn.checkpoint import atomic_dir, check_output_dir
from mmunlearn.errors import UnsafePathError
from mmunlearn.layout import ERASE_REPORT, HISTORY_DIR, PATCH_NAME, UNLEARN_REPORT

#: The default undo folder of ``out``: ``<out>.undo`` beside it.
UNDO_SUFFIX = ".undo"
#: The undo folder's own record (its id, the output it belongs to).
UNDO_INFO = "undo.json"
#: The report key that says where an output's undo records are.
UNDO_KEY = "undo"
_NAME_MAX = 255  # bytes in one file name on the usual file systems


def default_undo_dir(out: str | os.PathLike) -> Path:
    """``<out>.undo``, beside ``out``; for a name too long to take the suffix in one file name (255 bytes), its start
    and a hash of the whole name, then ``.undo``."""
    out = Path(out)
    name = out.name + UNDO_SUFFIX
    if len(os.fsencode(name)) > _NAME_MAX:
        short = ""
        for ch in out.name:  # whole characters, at most 120 bytes
            if len(os.fsencode(short + ch)) > 120:
                break
            short += ch
        name = f"{short}~{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:12]}{UNDO_SUFFIX}"
    return out.with_name(name)


def _reference(undo: Path, final: Path, ident: str) -> dict[str, str]:
    undo, final = Path(os.path.abspath(undo)), Path(os.path.abspath(final))
    folder = undo.name if undo.parent == final.parent else str(undo)
    return {"folder": folder, "id": ident}


def split_undo(staging: Path, final: Path, undo: str | os.PathLike | None = None, *, overwrite: bool = False,
               inputs: tuple = ()) -> dict[str, str] | None:
    """Move the undo records an output's ``staging`` folder holds (patch, history) into the undo folder ``undo``
    (default :func:`default_undo_dir` of ``final``), written atomically with mode 0700 before the output itself is
    renamed into place; the reference for the output's report (None when there was nothing to move)."""
    names = [n for n in (PATCH_NAME, HISTORY_DIR) if os.path.lexists(staging / n)]
    if not names:
        return None
    target = Path(undo) if undo is not None else default_undo_dir(final)
    ident = secrets.token_hex(16)
    with atomic_dir(target, overwrite=overwrite, inputs=(*inputs, final)) as tmp:
        for name in names:
            os.replace(staging / name, tmp / name)
        write_json_atomic(tmp / UNDO_INFO, {"id": ident, "output": final.name})
        os.chmod(tmp, 0o700)  # before the rename: the original weights are never readable by others
    os.chmod(target, 0o700)
    return _reference(target, final, ident)


def undo_dir_path(final: str | os.PathLike, ref: dict[str, str]) -> Path:
    """The undo folder a report's reference ``ref`` names, for the output ``final``."""
    name = ref["folder"]
    return Path(name) if os.path.isabs(name) else Path(os.path.abspath(final)).parent / name


def _read_json(path: Path) -> Any:
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            return json.loads(fh.read(1 << 20))
    except (OSError, json.JSONDecodeError, RecursionError, UnicodeDecodeError):
        return None


def _undo_reference(folder: Path) -> tuple[Path, dict] | None:
    """The report that names ``folder``'s undo folder and its reference: ``unlearn_report.json``'s (the harness),
    else ``erase_report.json``'s (``mmunlearn erase``); None when neither names one."""
    for name in (UNLEARN_REPORT, ERASE_REPORT):
        report = _read_json(folder / name)
        ref = report.get(UNDO_KEY) if isinstance(report, dict) else None
        if isinstance(ref, dict):
            return folder / name, ref
    return None


def undo_dir_of(folder: str | os.PathLike) -> Path | None:
    """The folder that holds ``folder``'s undo records: the undo folder its report names (checked: a real folder, not
    a link, whose ``undo.json`` carries the report's id), ``folder`` itself for an output that holds them inside, or
    None for a folder with no undo records. A report that names an undo folder that is missing or not its own is an
    error naming both."""
    folder = Path(folder)
    if os.path.lexists(folder / PATCH_NAME):
        return folder
    found = _undo_reference(folder)
    if found is None:
        return None
    source, ref = found
    name, ident = ref.get("folder"), ref.get("id")
    if not isinstance(name, str) or not name or not isinstance(ident, str):
        raise UnsafePathError(f"{source}: its 'undo' entry is not a folder and an id: {ref!r:.200}")
    path = undo_dir_path(folder, ref)
    if os.path.islink(path) or not path.is_dir():
        raise FileNotFoundError(f"{folder}: its undo records are kept apart, in {path}, which is missing or not a "
                                "folder (pass the patch with --patch, or move the .undo folder back beside it)")
    info = _read_json(path / UNDO_INFO)
    if not isinstance(info, dict) or info.get("id") != ident:
        raise UnsafePathError(f"{path} is not the undo folder of {folder} (its {UNDO_INFO} does not carry the id "
                              "the report names)")
    return path


def patch_of(folder: str | os.PathLike) -> Path:
    """The undo patch of the output ``folder``: in the undo folder its report names (:func:`undo_dir_of`), else where
    an older output kept it, inside the folder (which may not exist: the caller reports it)."""
    undo = undo_dir_of(folder)
    return (undo if undo is not None else Path(folder)) / PATCH_NAME


def release_problems(folder: str | os.PathLike) -> list[str]:
    """Why ``folder`` is not ready to release (empty: ready): undo records inside it hold the original weights."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    problems = []
    if os.path.lexists(folder / PATCH_NAME):
        problems.append(f"{PATCH_NAME}: the original values of every edited tensor (what was forgotten)")
    if os.path.lexists(folder / HISTORY_DIR):
        problems.append(f"{HISTORY_DIR}/: earlier requests' undo patches (the weights before each)")
    for path in sorted(folder.rglob(f"*{UNDO_SUFFIX}")):
        problems.append(f"{path.relative_to(folder)}: an undo folder inside the model folder")
    return problems


def move_undo(src_undo: Path, dst_out: Path, overwrite: bool, report: dict[str, Any],
              undo: str | os.PathLike | None = None, inputs: tuple = ()) -> None:
    """Rename an undo folder to ``undo`` (default :func:`default_undo_dir` of ``dst_out``: an output renamed there)
    and point ``report`` at it; ``undo`` may not be, lie in or contain one of ``inputs`` or ``dst_out``, and replaces
    only a folder mmunlearn wrote (with ``overwrite``)."""
    target = Path(undo) if undo is not None else default_undo_dir(dst_out)
    check_output_dir(target, *inputs, dst_out, overwrite=overwrite)
    if os.path.lexists(target):
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src_undo, target)
    report[UNDO_KEY] = _reference(target, dst_out, report[UNDO_KEY]["id"])
    report["undo_patch"] = str(Path(os.path.abspath(target)) / PATCH_NAME)


__all__ = ["UNDO_INFO", "UNDO_KEY", "UNDO_SUFFIX", "default_undo_dir", "move_undo", "patch_of", "release_problems",
           "split_undo", "undo_dir_of", "undo_dir_path"]
