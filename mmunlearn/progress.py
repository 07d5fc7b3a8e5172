"""Progress bars that suit where the output goes: a live bar on a terminal, a few whole lines in a log file.

A tqdm bar writing to a file or a pipe (``nohup ... > run.log``) repaints itself with carriage returns many times a
second, so a log of a long run is mostly bar fragments. :class:`StageBar` is a tqdm bar (same arguments, used the
same way) that, when its stream is not a terminal, writes nothing while it runs except one whole line every
``log_every`` seconds (done / total, elapsed, an estimate of what remains) and one line when it ends (``leave=False``
included: on a terminal such a bar vanishes, in a log its stage still gets its line): a stage in a log reads as one
line, a long stage as a few. A bar without a description is disabled by its callers (a pass inside a stage).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

from tqdm import std as tqdm_std
from tqdm.auto import tqdm

#: Seconds between the lines a long stage writes when its output is not a terminal.
LOG_EVERY = 300.0
_QUIETED = False  # whether this process's plain tqdm bars were turned off (quiet_library_bars)


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` (None: sys.stderr) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-like object without isatty
        return False


class StageBar(tqdm):
    """A tqdm bar: live on a terminal; elsewhere one line per stage (and one per ``log_every`` seconds)."""

    def __init__(self, *args: Any, log_every: float = LOG_EVERY, **kwargs: Any) -> None:
        self._live = is_terminal(kwargs.get("file"))
        kwargs.setdefault("disable", False)  # explicit: TQDM_DISABLE (set by quiet_library_bars) is for other bars
        self._log_every, self._last_line = float(log_every), time.monotonic()
        super().__init__(*args, **kwargs)

    def _line(self, end: bool) -> str:
        elapsed = self.format_interval(self.format_dict["elapsed"])
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        unit = "item" if self.unit == "it" else self.unit  # tqdm's default unit, spelled out
        if end:
            return f"{self.desc or 'progress'}: {done} {unit}s in {elapsed}"
        rate = self.format_dict.get("rate") or (
            self.n / self.format_dict["elapsed"] if self.format_dict["elapsed"] else 0
        )
        left = (
            f", about {self.format_interval((self.total - self.n) / rate)} left"
            if self.total and rate and self.n < self.total
            else ""
        )
        return f"{self.desc or 'progress'}: {done} {unit}s, {elapsed} elapsed{left}"

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if self._live:
            return super().display(msg, pos)
        now = time.monotonic()
        if self.n and now - self._last_line >= self._log_every:
            self._last_line = now
            self.fp.write(self._line(end=False) + "\n")
            self.fp.flush()
        return True

    def close(self) -> None:
        if not self._live and not self.disable:
            self.fp.write(self._line(end=True) + "\n")
            self.fp.flush()
            # tqdm's close skips its final repaint (a newline or a carriage return) for a bar that never displayed
            self.last_print_t = float("-inf")
        super().close()


def _plain_bars_off_here() -> None:
    """In this process: plain tqdm bars made from now on default to ``disable=True``. tqdm read ``TQDM_DISABLE`` when
    it was imported (``import mmunlearn`` already imports it), so the variable alone reaches only new processes; a bar
    that passes ``disable`` itself (StageBar's ``disable=False``) keeps its own value."""
    global _QUIETED
    if not _QUIETED:
        tqdm_std.tqdm.__init__ = functools.partialmethod(tqdm_std.tqdm.__init__, disable=True)
        _QUIETED = True


def quiet_library_bars() -> None:
    """Turn off the Hub's and transformers' own bars ("Loading weights", downloads): for output that is a log file.

    The bars libraries make with plain tqdm (transformers' GGUF conversion) are turned off in this process and, by
    ``TQDM_DISABLE``, in the worker processes it starts (tqdm reads it when first imported); StageBar passes
    ``disable`` itself, so ours stay.
    """
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by huggingface_hub when first imported
    os.environ["TQDM_DISABLE"] = "1"
    _plain_bars_off_here()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


__all__ = ["LOG_EVERY", "StageBar", "is_terminal", "quiet_library_bars"]
