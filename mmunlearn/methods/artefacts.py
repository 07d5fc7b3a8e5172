"""The extras the built-in methods write into an output folder and read back: erasure's report and plot, T3's head.

The harness writes what every method has (the model, ``unlearn_report.json``, and for a weight edit the undo
patch); a method's own files are saved and reloaded by the :class:`~mmunlearn.methods.base.Artefacts` it
registers with, so a new method with files of its own touches neither the harness nor the loaders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmunlearn.layout import ERASE_REPORT, PLOT_NAME, TILT_DIR
from mmunlearn.methods.base import MethodResult


class EraseFiles:
    """Erasure's report (layers, energies, ranks, norms removed) and its per-layer energy plot; the weights in the
    folder are already the unlearned model, so :meth:`load` returns the adapter as it is."""

    files = (ERASE_REPORT, PLOT_NAME)

    def save(self, result: MethodResult, staging: Path, final: Path, report: dict) -> None:
        erase_report = result.erase_report
        if erase_report is None or "undo_patch" not in report:  # nothing edited: no report of an edit
            return
        erase_report.patch_path = report["undo_patch"]
        erase_report.to_json(staging / ERASE_REPORT)
        erase_report.plot_energy(staging / PLOT_NAME)
        report["erase_report"] = str(final / ERASE_REPORT)

    def present(self, folder: Path) -> bool:
        return (Path(folder) / ERASE_REPORT).is_file()

    def load(self, folder: Path, adapter: Any) -> Any:
        return adapter


class TiltFiles:
    """T3's head and its settings in ``tilt/``; the weights beside it are the unchanged base, which
    :meth:`load` wraps with the head."""

    files = (TILT_DIR,)

    def save(self, result: MethodResult, staging: Path, final: Path, report: dict) -> None:
        tilt = result.adapter.model
        tilt.base_path = str(final)
        tilt.save(staging / TILT_DIR, overwrite=True)
        report["tilt_dir"] = str(final / TILT_DIR)

    def present(self, folder: Path) -> bool:
        return (Path(folder) / TILT_DIR).is_dir()

    def load(self, folder: Path, adapter: Any) -> Any:
        from mmunlearn.tilt import TiltedCausalLM  # deferred: tilt imports transformers, kept out of CLI start

        return adapter.with_model(TiltedCausalLM.load(Path(folder) / TILT_DIR, base=adapter.model))


ERASE_FILES = EraseFiles()
TILT_FILES = TiltFiles()

__all__ = ["ERASE_FILES", "EraseFiles", "TILT_FILES", "TiltFiles"]
