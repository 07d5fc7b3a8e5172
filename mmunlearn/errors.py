"""Errors caused by what a person passed in (files, folders, options), and how the CLI shows them.

A :class:`UserError` (or one of the built-in errors listed in :data:`USER_ERRORS`) means the input
is wrong, not the code: the ``mmunlearn`` command prints it as one line, ``error: <message>``, and
exits with status 2; ``--debug`` or ``MMUNLEARN_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEBUG_ENV = "MMUNLEARN_DEBUG"


class UserError(Exception):
    """Bad input: a missing or malformed file, an unsafe path, an impossible option value."""


class UnsafePathError(UserError, ValueError):
    """A path that would read or write outside the folder it belongs to, or replace the wrong folder."""


class NonFiniteError(UserError, ValueError):
    """An edit would write NaN or Inf weights."""


class WriteError(UserError, OSError):
    """An output could not be written: the disk is full, a quota or the file-size limit (``ulimit -f``) hit.
    Names the file being written (not an input it was copied from); ``why`` is the system's reason."""

    why: str = ""


# What the CLI reports in one line (exit 2) rather than as a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, OSError, ValueError, KeyError)


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (a KeyError's message without the quotes ``str`` adds)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}"  # e.g. "Permission denied: /some/file"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


@contextmanager
def about(files: str) -> Iterator[None]:
    """Append ``(files)`` to the message of a plain ValueError / KeyError raised in the block, so a
    library's complaint about a tensor also names the files it came from. Other errors pass as they are."""
    try:
        yield
    except (ValueError, KeyError) as exc:
        if type(exc) not in (ValueError, KeyError):
            raise
        raise type(exc)(f"{one_line(exc)} ({files})") from exc


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})
# how writers that wrap the OS error in their own exception (safetensors: "... (os error 28)") say it
_FULL_TEXT = re.compile(r"No space left on device|File too large|Disk quota exceeded|os error (?:27|28|122)\b")


@contextmanager
def writing(path: str | os.PathLike, shown: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn "disk full / file too large / over quota" raised in the block (as an OSError, or as a writer's own
    exception quoting the OS error) into a :class:`WriteError` naming ``shown`` (default ``path``), the file
    being written. Other errors pass as they are."""
    try:
        yield
    except WriteError as exc:
        if shown is None:
            raise
        raise _write_error(shown, exc.why) from exc  # an inner writer named a temporary file: name the output
    except Exception as exc:  # noqa: BLE001 - only the "full" cases are rewritten, everything else re-raised
        full = exc.errno in _FULL_ERRNOS if isinstance(exc, OSError) else bool(_FULL_TEXT.search(str(exc)))
        if not full:
            raise
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc)
        raise _write_error(shown if shown is not None else path, why) from exc


def _write_error(file: str | os.PathLike, why: str) -> WriteError:
    error = WriteError(
        f"cannot write {file}: {why} (free some space, or raise the file-size limit or quota, and "
        "run again; nothing was left behind)"
    )
    error.why = why
    return error


def debug_enabled() -> bool:
    """Whether ``MMUNLEARN_DEBUG`` asks for tracebacks (any value but empty, 0, false, no)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def check_threads(n: int | None) -> int | None:
    """Validate a ``--threads`` value: None (leave torch's default) or an integer >= 1."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"--threads must be an integer >= 1, got {n!r}")
    return n


def set_threads(n: int | None) -> None:
    """``torch.set_num_threads(n)`` after :func:`check_threads`; None leaves the current setting."""
    if check_threads(n) is None:
        return
    import torch

    torch.set_num_threads(n)


def run_app(app, argv: list[str] | None, prog_name: str) -> None:
    """Run a Typer ``app``; an error a user caused prints as one ``error:`` line and exits 2 (``MMUNLEARN_DEBUG=1``:
    the traceback), as the ``mmunlearn`` command does. For the ``python -m data_prep.*`` entry points."""
    import sys

    import typer  # deferred: the library's error types need no CLI framework

    try:
        app(args=argv, prog_name=prog_name)
    except USER_ERRORS as exc:
        if debug_enabled():
            raise
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(2)


def run_main(main: Any, argv: list[str] | None = None) -> Any:
    """Call an argparse entry point ``main(argv)``; an error a user caused prints as one ``error:`` line and exits 2
    (``MMUNLEARN_DEBUG=1``: the traceback), as the ``mmunlearn`` command does. For ``python -m data_prep.*``."""
    import sys

    try:
        return main(argv)
    except (*USER_ERRORS, RecursionError) as exc:
        if debug_enabled():
            raise
        text = "nested too deeply to be read" if isinstance(exc, RecursionError) else one_line(exc)
        print(f"error: {text}", file=sys.stderr)
        sys.exit(2)
