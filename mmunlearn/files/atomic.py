"""Atomic file writes: a temporary sibling file, flushed, then renamed over the target.

A reader sees either the old file or the complete new one, never a partial write; a failed write
leaves no temporary file behind. The new file gets ordinary permissions (0o666 minus the umask).

:func:`write_bytes_atomic`, :func:`write_text_atomic` and :func:`write_json_atomic` write data held
in memory; :func:`atomic_path` serves writers that want a path of their own (safetensors
``save_file``, ``torch.save``, matplotlib ``savefig``, soundfile, csv writers).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on a clean exit it replaces ``path`` atomically.

    The temporary file (created empty, hidden, in ``path``'s folder, which is created if needed)
    ends with ``path``'s suffix, so writers that pick a format from the name (matplotlib,
    soundfile) write the same format as for ``path``. When the block ends without an error the
    file is flushed to disk, given mode 0o666 minus the umask and renamed over ``path``; when the
    block (or the rename) raises, the temporary file is removed and ``path`` is left as it was.
    The writer must write to the yielded path itself, not to a name derived from it.

    >>> import shutil, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with atomic_path(folder / "notes.txt") as tmp:
    ...     _ = tmp.write_text("done")
    >>> (folder / "notes.txt").read_text(), sorted(p.name for p in folder.iterdir())
    ('done', ['notes.txt'])
    >>> shutil.rmtree(folder)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + rename); returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode(encoding))


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (strict: NaN and Inf are refused) to ``path`` atomically; returns the path."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def _fsync(path: Path) -> None:
    """Flush ``path``'s data to disk (a writer that closed the file has only handed it to the OS)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def file_mode() -> int:
    """The mode a new file gets from ``open``: 0o666 minus the umask (0o644 under the usual 022)."""
    return 0o666 & ~_umask()


class Terminated(BaseException):
    """SIGTERM arrived while an output was being written: raised like Ctrl-C's KeyboardInterrupt, so the same
    clean-up runs (:func:`terminate_raises` then ends the process by SIGTERM, as the signal asked)."""


def _raise_terminated(signum: int, frame) -> None:
    raise Terminated(f"terminated by signal {signum}")


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (as SIGINT raises KeyboardInterrupt), so ``finally``
    clauses remove temporary outputs; the previous handler is put back after. Only the main thread can
    install a handler, and a handler someone else installed is left alone: the block then runs as it is.
    Once the block's clean-up ran, the process ends by SIGTERM as it would have without the handler."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action, now that the temporary output is gone
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
