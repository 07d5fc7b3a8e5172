"""Figures for reports and recipes: one helper that opens a matplotlib figure (Agg, no display needed) and writes it
atomically as a PNG when the drawing code is done, closing it either way."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmunlearn.files.atomic import atomic_path

#: resolution of every figure mmunlearn writes
DPI = 120


@contextmanager
def figure(path: str | os.PathLike, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``(fig, axes)`` of ``plt.subplots(**subplots)`` to draw on; when the block ends cleanly the figure is laid
    out tight and written to ``path`` (PNG, :data:`DPI`) through :func:`~mmunlearn.files.atomic.atomic_path`; when it
    raises nothing is written. The figure is closed in both cases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        with atomic_path(Path(path)) as tmp:
            fig.savefig(tmp, dpi=DPI, format="png")
    finally:
        plt.close(fig)
