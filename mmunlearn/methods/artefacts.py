"""The extras the built-in methods write into an output folder and read back: erasure's report and plot, T3's head.

The harness writes what every method has (the model, ``unlearn_report.json``, and for a weight edit the undo
patch); a method's own files are saved and reloaded by the :class:`~mmunlearn.methods.base.Artefacts` it
registers with, so a new method with files of its own touches neither the harness nor the loaders.

T3's output keeps the unchanged base under ``base/`` and puts at its top level a ``config.json`` whose model type
transformers does not know (:data:`T3_MODEL_TYPE`, which says to use ``mmunlearn.load``) and a ``tokenizer.json``
whose format version tokenizers does not know (:data:`T3_TOKENIZER_VERSION`, saying the same): the model and the
tokenizer of the output both fail to load with transformers' Auto classes, each error naming ``mmunlearn.load``,
instead of giving the target as if nothing had been forgotten (without the tokenizer stub, ``AutoTokenizer`` would
say to install sentencepiece). Both are plain JSON: nothing in the folder is code, and nothing runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mmunlearn.files.layout import ERASE_REPORT, MARKER, PATCH_NAME, PLOT_NAME, TILT_BASE_DIR, TILT_DIR, UNLEARN_REPORT
from mmunlearn.methods.base import MethodResult

#: The model type of the config.json at a T3 output's top level: transformers refuses it, naming it in its error
#: (which goes on to suggest upgrading transformers: the type says first that no upgrade helps).
T3_MODEL_TYPE = (
    "mmunlearn-t3 (not a transformers version problem: no upgrade or package loads it. An unlearning "
    "output whose weights, in base/, are the unchanged target and whose unlearning is the head in tilt/: "
    "load the tilted model with mmunlearn.load(folder))"
)
#: The name of that config.json.
T3_STUB = "config.json"
#: The format version of the tokenizer.json at a T3 output's top level: the tokenizers library refuses it and names
#: it in its error ("Unknown tokenizer version '...'"), which ``AutoTokenizer.from_pretrained`` passes on.
T3_TOKENIZER_VERSION = (
    "mmunlearn-t3 (not a tokenizer or package version problem: no upgrade, sentencepiece or "
    "tiktoken loads it. A T3 unlearning output, a serving-time filter over the unchanged model in "
    "base/: load the model and its tokenizer with mmunlearn.load(folder))"
)
#: The name of that tokenizer.json.
T3_TOKENIZER_STUB = "tokenizer.json"


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

    def model_folder(self, folder: Path) -> Path:
        return Path(folder)


class TiltFiles:
    """T3's head and its settings in ``tilt/``, the unchanged base's files moved into ``base/`` (which
    ``tilt/tilt_config.json`` names, relative) and a top-level config.json and tokenizer.json transformers refuses
    (each naming ``mmunlearn.load``); :meth:`load`
    wraps the base with the head."""

    files = (TILT_DIR,)

    def save(self, result: MethodResult, staging: Path, final: Path, report: dict) -> None:
        """Move the model files the harness wrote into ``staging`` under ``base/``; write the head and the stub."""
        holding = staging / f".{TILT_BASE_DIR}-moving"  # the model may itself hold an entry named like the folder
        holding.mkdir()
        for item in list(staging.iterdir()):
            if item.name not in (holding.name, MARKER, UNLEARN_REPORT, PATCH_NAME):
                os.replace(item, holding / item.name)
        os.replace(holding, staging / TILT_BASE_DIR)
        tilt = result.adapter.model
        tilt.base_path = TILT_BASE_DIR
        tilt.save(staging / TILT_DIR, overwrite=True)
        stub = {
            "model_type": T3_MODEL_TYPE,
            "mmunlearn": {
                "method": "t3",
                "base_model": TILT_BASE_DIR,
                "tilt": TILT_DIR,
                "load_with": "mmunlearn.load(folder)",
            },
        }
        (staging / T3_STUB).write_text(json.dumps(stub, indent=2))
        # "added_tokens" lets transformers' own reading of the file through to the tokenizers library's, which
        # refuses the version and names it
        tokenizer_stub = {
            "version": T3_TOKENIZER_VERSION,
            "added_tokens": [],
            "model": {"type": "BPE", "vocab": {}, "merges": []},
        }
        (staging / T3_TOKENIZER_STUB).write_text(json.dumps(tokenizer_stub, indent=2))
        report["tilt_dir"] = str(final / TILT_DIR)
        report["base_model"] = str(final / TILT_BASE_DIR)

    def present(self, folder: Path) -> bool:
        return (Path(folder) / TILT_DIR).is_dir()

    def model_folder(self, folder: Path) -> Path:
        """The base's folder ``tilt/tilt_config.json`` names (a plain name beside ``tilt/``, else refused)."""
        from mmunlearn.tilt.model import recorded_base  # deferred: tilt imports transformers, kept out of CLI start

        base = recorded_base(Path(folder) / TILT_DIR)
        if base is None:
            raise ValueError(f"{Path(folder) / TILT_DIR} records no base model: not a T3 output folder")
        return base

    def load(self, folder: Path, adapter: Any) -> Any:
        from mmunlearn.tilt import TiltedCausalLM  # deferred: tilt imports transformers, kept out of CLI start

        return adapter.with_model(TiltedCausalLM.load(Path(folder) / TILT_DIR, base=adapter.model))


ERASE_FILES = EraseFiles()
TILT_FILES = TiltFiles()

__all__ = [
    "ERASE_FILES",
    "EraseFiles",
    "T3_MODEL_TYPE",
    "T3_STUB",
    "T3_TOKENIZER_STUB",
    "T3_TOKENIZER_VERSION",
    "TILT_FILES",
    "TiltFiles",
]
