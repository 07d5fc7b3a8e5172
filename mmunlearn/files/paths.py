"""Path safety for the folders mmunlearn reads (checkpoints, task matrices) and writes (outputs).

Rules, checked before anything is read or written:

* a file named by an index (``model.safetensors.index.json``, a task-matrix index) is a plain name
  inside the index's folder: no ``/`` or ``\\``, not ``.`` / ``..``, not absolute;
* a symbolic link inside a model folder must point inside that folder (or, for a Hugging Face cache
  snapshot ``<repo>/snapshots/<rev>``, into ``<repo>/blobs``); FIFOs, sockets and devices are refused;
* an output folder is never an input, inside one, or a folder that holds one (resolved paths);
* ``overwrite`` replaces only a folder mmunlearn wrote: every output folder holds a marker file
  :data:`MARKER`, and an existing folder without it (unless empty) is never replaced.

Temporary folders of an output ``out`` are named ``.<out>.tmp-<pid>-<host>-<token>`` (and
``.<out>.old-...`` while an old output is swapped out; for an ``out`` name too long to take the ~30
extra characters within the 255 a file name may have, ``<out>`` is shortened to its start and a hash
of the whole name); those left by a killed run are removed by the next run on the same ``out``
(:func:`clean_leftovers`).

A folder whose contents are trusted when reused (the model cache, resumable training state) must be
private (:func:`check_private`): owned by this user and writable by no one else.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

from mmunlearn.errors import UnsafePathError
from mmunlearn.files.atomic import dir_mode
from mmunlearn.files.layout import MARKER  # JSON (tool, version) in every folder atomic_dir writes

log = logging.getLogger(__name__)


def plain_name(name: object, listed_in: str | os.PathLike) -> str:
    """``name`` if it is a plain file name inside its folder, else :class:`UnsafePathError`."""
    bad = (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.isabs(name)
        or (os.altsep is not None and os.altsep in name)
    )
    if bad:
        raise UnsafePathError(
            f"{listed_in} names the file {name!r}: only plain file names inside its folder "
            "are allowed (no '/', '..' or absolute paths)"
        )
    return name


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a symbolic-link loop
        raise UnsafePathError(f"{path} cannot be resolved ({exc})") from exc


def allowed_roots(root: Path) -> list[Path]:
    """Where links inside ``root`` may point: ``root`` itself, plus ``<repo>/blobs`` for a HF cache snapshot."""
    real = _resolve(root)
    roots = [real]
    if real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir():
        roots.append(real.parent.parent / "blobs")
    return roots


def check_tree(root: str | os.PathLike, outside_files: bool = False) -> None:
    """Refuse a folder holding a symbolic link whose target leaves it (or is missing), or a special file.

    Links are not followed while walking; a link to a folder inside ``root`` is checked, not entered.
    ``outside_files=True`` lets a link point to a regular file outside ``root`` (SpeechBrain's ``savedir``
    links every file to its source folder; such folders are read as data and never copied).
    """
    root = Path(root)
    roots = allowed_roots(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            _check_entry(Path(dirpath) / name, root, roots, outside_files)


def check_entry(path: str | os.PathLike, root: str | os.PathLike) -> None:
    """:func:`check_tree` for one entry of ``root`` (e.g. a file an index names): a link must stay inside."""
    _check_entry(Path(path), Path(root), allowed_roots(Path(root)))


def _check_entry(p: Path, root: Path, roots: list[Path], outside_files: bool = False) -> None:
    if p.is_symlink():
        target = _resolve(p)
        if outside_files and target.is_file():
            return
        if outside_files and target.exists() and not target.is_dir():
            raise UnsafePathError(
                f"{p} is a symbolic link to {target}, which is not a regular file (a FIFO, "
                "socket or device): refusing to read it"
            )
        if not any(_inside(target, r) for r in roots):
            raise UnsafePathError(
                f"{p} is a symbolic link to {target}, outside {root}: refusing to "
                "read or copy it (replace the link by the file itself)"
            )
        if not target.exists():
            raise FileNotFoundError(f"{p} is a broken symbolic link (to {target})")
    elif os.path.lexists(p) and not (p.is_file() or p.is_dir()):
        raise UnsafePathError(
            f"{p} is not a regular file or folder (a FIFO, socket or device): refusing to read or copy it"
        )


def check_apart(out: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Refuse (:class:`UnsafePathError`) an output folder ``out`` that is one of ``inputs`` (folders or files of any
    role: model, reference, forget and retain sets, undo folders), lies inside one or contains one (resolved paths;
    None inputs are skipped). Nothing on disk is looked at but the paths."""
    real = _resolve(Path(out))
    for given in inputs:
        if given is None:
            continue
        inp = _resolve(Path(given))
        if real == inp:
            raise UnsafePathError(
                f"output folder {out} is the input {given}: the output must differ from "
                "every input (inputs are never modified)"
            )
        if inp in real.parents:
            raise UnsafePathError(f"output folder {out} is inside the input {given}: choose a folder outside it")
        if real in inp.parents:
            raise UnsafePathError(
                f"output folder {out} contains the input {given}: replacing it would delete "
                "the input; choose another folder"
            )


def check_holds_none(out: str | os.PathLike, files: Iterable[str | os.PathLike], role: str) -> None:
    """Refuse an output folder ``out`` that contains one of ``files`` (e.g. the audio clips a manifest names: writing
    or replacing ``out`` would delete them); compared through the files' distinct folders, so a million rows cost one
    check per folder. ``role`` names the files in the error."""
    real = _resolve(Path(out))
    seen: set[str] = set()
    for f in files:
        parent = os.path.dirname(os.path.abspath(os.fspath(f)))
        if parent in seen:
            continue
        seen.add(parent)
        folder = _resolve(Path(parent))
        if folder == real or real in folder.parents:
            raise UnsafePathError(
                f"output folder {out} holds {role} ({f}): writing it would delete them; choose a folder outside it"
            )


def check_output_dir(out: str | os.PathLike, *inputs: str | os.PathLike | None, overwrite: bool = False) -> Path:
    """Check that ``out`` may be written as a new (or replacing) output folder; returns it as a Path.

    Raises :class:`UnsafePathError` when ``out`` is one of ``inputs``, inside one, or holds one
    (compared as resolved paths; None inputs are skipped), or when ``overwrite`` would replace
    something mmunlearn did not write (a file, or a non-empty folder without :data:`MARKER`);
    ``FileExistsError`` when ``out`` exists and ``overwrite`` is False. Nothing is created.
    """
    out = Path(out)
    check_apart(out, *inputs)
    if os.path.lexists(out):
        if not overwrite:
            raise FileExistsError(
                f"output directory already exists: {out} (use --overwrite to replace a folder mmunlearn wrote)"
            )
        if not out.is_dir():
            raise UnsafePathError(f"output {out} exists and is not a folder: refusing to replace it")
        if not (out / MARKER).is_file() and any(out.iterdir()):
            raise UnsafePathError(
                f"{out} was not written by mmunlearn (no {MARKER} marker file): --overwrite "
                "only replaces mmunlearn's own output folders; remove it yourself or choose "
                "another output folder"
            )
    return out


# ---------------------------------------------------------------------------- temporary folders
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_OURS = re.compile(r"(\d+)-([0-9a-f]{8})-[0-9a-f]{8}")
_LEGACY = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkdtemp names of earlier versions


_NAME_MAX = 255  # bytes in one file name on the usual file systems
_SUFFIX_LEN = 40  # ".<kind>-<pid>-<host>-<token>" with room for long pids


def _temp_prefix(out: Path, kind: str) -> str:
    """``.<out>.<kind>-``, with ``<out>`` shortened (its start + a hash of the whole name) when the temporary
    name would not fit in one file name."""
    name = out.name
    if len(os.fsencode(name)) + 2 + _SUFFIX_LEN > _NAME_MAX:
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
        short = ""
        for ch in name:  # whole characters, at most 120 bytes
            if len(os.fsencode(short + ch)) > 120:
                break
            short += ch
        name = f"{short}~{digest}"
    return f".{name}.{kind}-"


def make_temp_dir(out: Path, kind: str) -> Path:
    """A new empty sibling folder ``.<out>.<kind>-<pid>-<host>-<token>`` with ordinary permissions."""
    while True:
        path = out.parent / f"{_temp_prefix(out, kind)}{os.getpid()}-{_HOST}-{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o777)  # the umask applies, as for any new folder
        except FileExistsError:
            continue
        os.chmod(path, dir_mode())
        return path


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def clean_leftovers(out: str | os.PathLike) -> list[Path]:
    """Remove the temporary folders of ``out`` that killed runs left next to it; returns them.

    Only folders of a process of this host that no longer runs (or with an earlier version's
    names) are removed, so a concurrent run writing the same output keeps its own. Says so on
    stderr (a logging warning).
    """
    out = Path(out)
    if not out.parent.is_dir():
        return []
    removed = []
    for p in sorted(out.parent.iterdir()):
        for kind in ("tmp", "old"):
            prefix = _temp_prefix(out, kind)
            if not p.name.startswith(prefix) or p.is_symlink() or not p.is_dir():
                continue
            rest = p.name[len(prefix) :]
            ours = _OURS.fullmatch(rest)
            stale = (
                ours is not None and ours.group(2) == _HOST and not _alive(int(ours.group(1)))
            ) or _LEGACY.fullmatch(rest) is not None
            if stale:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    if removed:
        log.warning(
            "removed %d temporary folder(s) left next to %s by an interrupted run: %s",
            len(removed),
            out,
            ", ".join(p.name for p in removed),
        )
    return removed


def check_private(*paths: str | os.PathLike) -> None:
    """Refuse each existing path that another user owns or that its group or others may write: a cache another
    user can write could hand this user forged weights or training state. Links are judged by what they point
    to and must be this user's too."""
    me = os.geteuid()
    for p in map(Path, paths):
        try:
            lst, st = os.lstat(p), os.stat(p)
        except FileNotFoundError:
            continue
        if lst.st_uid != me or st.st_uid != me:
            raise UnsafePathError(
                f"{p} is owned by another user (uid {st.st_uid if lst.st_uid == me else lst.st_uid}"
                f", you are {me}): a shared cache is not trusted with models or training state; "
                "use a cache folder of your own (--cache-dir, $MMUNLEARN_CACHE)"
            )
        if st.st_mode & 0o022:
            raise UnsafePathError(
                f"{p} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o}): a "
                f"shared cache is not trusted with models or training state; run chmod -R go-w {p} "
                "or use a cache folder of your own"
            )


def make_private_dirs(path: str | os.PathLike) -> Path:
    """Create ``path`` and its missing parents with mode 0700 (whatever the umask); returns it."""
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)  # the umask cannot add bits, but be explicit
    return path
