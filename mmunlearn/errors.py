"""Errors caused by what a person passed in (files, folders, options), and how the CLI shows them.

A :class:`UserError` (or one of the built-in errors listed in :data:`USER_ERRORS`) means the input
is wrong, not the code: the ``mmunlearn`` command prints it as one line, ``error: <message>``, and
exits with status 2; ``--debug`` or ``MMUNLEARN_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

DEBUG_ENV = "MMUNLEARN_DEBUG"


class UserError(Exception):
    """Bad input: a missing or malformed file, an unsafe path, an impossible option value."""


class UnsafePathError(UserError, ValueError):
    """A path that would read or write outside the folder it belongs to, or replace the wrong folder."""


class NonFiniteError(UserError, ValueError):
    """An edit would write NaN or Inf weights."""


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
