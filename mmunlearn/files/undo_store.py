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
import stat
from pathlib import Path
from typing import Any

from mmunlearn.errors import UnsafePathError
from mmunlearn.files.atomic import write_json_atomic
from mmunlearn.files.checkpoint import INDEX, SINGLE, atomic_dir, check_output_dir
from mmunlearn.files.held_weights import stray_weights
from mmunlearn.files.layout import ERASE_REPORT, HISTORY_DIR, PATCH_NAME, TILT_BASE_DIR, TILT_DIR, UNLEARN_REPORT
from mmunlearn.files.safecopy import read_inside

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


def split_undo(
    staging: Path, final: Path, undo: str | os.PathLike | None = None, *, overwrite: bool = False, inputs: tuple = ()
) -> dict[str, str] | None:
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
    """The JSON in ``path`` (at most 1 MiB, no link followed), None when it is missing or not JSON; a FIFO, device
    or socket is refused (never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{path} is not a regular file (a FIFO, device or socket): refusing to read it")
        try:
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
        raise FileNotFoundError(
            f"{folder}: its undo records are kept apart, in {path}, which is missing or not a "
            "folder (pass the patch with --patch, or move the .undo folder back beside it)"
        )
    _check_private(path)
    info = _read_json(path / UNDO_INFO)
    if not isinstance(info, dict) or info.get("id") != ident:
        raise UnsafePathError(
            f"{path} is not the undo folder of {folder} (its {UNDO_INFO} does not carry the id the report names)"
        )
    return path


def _check_private(path: Path) -> None:
    """Refuse an undo folder owned by another user or writable by its group or others: its records steer restore and
    later edits of the model, so one someone else could have written is not trusted."""
    st = os.stat(path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafePathError(
            f"{path} is an undo folder owned by another user (uid {st.st_uid}, you are "
            f"{os.getuid()}): undo records you did not write are not trusted"
        )
    if st.st_mode & 0o022:
        raise UnsafePathError(
            f"{path} is an undo folder writable by its group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): its records may not be yours; chmod 700 it if they are"
        )


def patch_of(folder: str | os.PathLike) -> Path:
    """The undo patch of the output ``folder``: in the undo folder its report names (:func:`undo_dir_of`), else where
    an older output kept it, inside the folder (which may not exist: the caller reports it)."""
    undo = undo_dir_of(folder)
    return (undo if undo is not None else Path(folder)) / PATCH_NAME


#: The largest ``unlearn_report.json`` check-release reads (a report is kilobytes).
REPORT_LIMIT = 64 << 20
#: Why a T3 output is never ready to release (its weights are the target's).
SERVING_FILTER = (
    "a T3 output: its weights (base/) are the unchanged model, which still holds the forget set; the "
    "forgetting is a decoding-time filter (tilt/) that only mmunlearn.load applies, and anyone loading "
    "base/ with transformers gets the original model. Serve it through mmunlearn.load; release weights "
    "only from a method that edits them"
)


def read_release_report(folder: str | os.PathLike) -> dict[str, Any] | None:
    """``folder``'s ``unlearn_report.json`` (None when it has none), read without following a link and at most
    :data:`REPORT_LIMIT` bytes; a report that is not a JSON object is an error naming it."""
    path = Path(folder) / UNLEARN_REPORT
    if not os.path.lexists(path):
        return None
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
        raise UnsafePathError(f"{path} is not a regular file (a FIFO, device or socket): refusing to read it")
    try:
        report = json.loads(read_inside(folder, UNLEARN_REPORT, REPORT_LIMIT))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be an unlearning report") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not an unlearning report (not a JSON object)")
    return report


def _live_weights(folder: Path) -> set[str]:
    """The weight files the folder's model loads: ``model.safetensors`` or the shards its index names (also under a
    T3 output's ``base/`` and its ``tilt/`` head), a SpeechBrain folder's top-level checkpoints."""
    live: set[str] = set()
    for sub in ("", TILT_BASE_DIR):
        root = folder / sub
        if (root / INDEX).is_file():
            try:
                shards = set(json.loads(read_inside(root, INDEX, REPORT_LIMIT))["weight_map"].values())
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                shards = set()  # an unreadable index names no live shard: every shard is reported
            live |= {os.path.join(sub, s) for s in shards if isinstance(s, str)}
        live.add(os.path.join(sub, SINGLE))
    if (folder / "hyperparams.yaml").is_file():
        live |= {p.name for p in folder.glob("*.ckpt") if p.is_file() and not p.is_symlink()}
    live |= {os.path.join(TILT_DIR, p.name) for p in (folder / TILT_DIR).glob("*.safetensors")}
    return live


def release_problems(folder: str | os.PathLike) -> list[str]:
    """Why ``folder`` is not ready to release (empty: ready): a T3 output (the unchanged weights under a decoding
    filter), a report saying the rule was missed, undo records, or any other file that may hold the original weights
    (:func:`mmunlearn.files.held_weights.stray_weights`, the whole folder walked)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    problems = []
    report = read_release_report(folder)
    if os.path.lexists(folder / TILT_DIR) or (report is not None and str(report.get("method", "")).startswith("t3")):
        problems.append(SERVING_FILTER)
    if report is not None and report.get("target_reached") is False:
        verdict = str(report.get("verdict"))[:300]
        problems.append(f"{UNLEARN_REPORT}: its own report says the rule was missed ({verdict})")
    if os.path.lexists(folder / PATCH_NAME):
        problems.append(f"{PATCH_NAME}: the original values of every edited tensor (what was forgotten)")
    if os.path.lexists(folder / HISTORY_DIR):
        problems.append(f"{HISTORY_DIR}/: earlier requests' undo patches (the weights before each)")
    for path in sorted(folder.rglob(f"*{UNDO_SUFFIX}")):
        problems.append(f"{path.relative_to(folder)}: an undo folder inside the model folder")
    named = {PATCH_NAME, HISTORY_DIR + "/"} | {f"{p.relative_to(folder)}/" for p in folder.rglob(f"*{UNDO_SUFFIX}")}
    for rel in stray_weights(folder, _live_weights(folder)):
        if rel not in named:
            problems.append(f"{rel}: a weight file the model does not load (it may hold the original weights)")
    return problems


def move_undo(
    src_undo: Path,
    dst_out: Path,
    overwrite: bool,
    report: dict[str, Any],
    undo: str | os.PathLike | None = None,
    inputs: tuple = (),
) -> None:
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


__all__ = [
    "REPORT_LIMIT",
    "SERVING_FILTER",
    "UNDO_INFO",
    "UNDO_KEY",
    "UNDO_SUFFIX",
    "default_undo_dir",
    "move_undo",
    "patch_of",
    "read_release_report",
    "release_problems",
    "split_undo",
    "undo_dir_of",
    "undo_dir_path",
]
