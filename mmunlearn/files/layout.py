"""The names mmunlearn writes into its output folders, in one place; an input may not use them for its own files.

An erase, a restore and the unlearning harness write a model folder in the layout it was read in, plus
the files below. A shard named like one of them (``"weight_map": {...: "erase_report.json"}``) would be
overwritten by the report, the marker or the plot and leave a model that does not load, so
:func:`check_not_reserved` refuses such a name before anything is written.
"""

from __future__ import annotations

import os

#: the undo patch: restores the input bit for bit
PATCH_NAME = "undo_patch.safetensors"
#: erase's report (layers, energies, ranks, norms removed)
ERASE_REPORT = "erase_report.json"
#: the per-layer task energy plot of an erase
PLOT_NAME = "layer_energy.png"
#: the unlearning harness's report
UNLEARN_REPORT = "unlearn_report.json"
#: T3's head folder
TILT_DIR = "tilt"
#: T3's output: the folder holding the unchanged base model's own files (beside ``tilt/``; the output's top level
#: holds a config.json and a tokenizer.json that transformers refuses, so the folder never loads as the unchanged base)
TILT_BASE_DIR = "base"
#: the marker that lets ``--overwrite`` replace a folder mmunlearn wrote
MARKER = ".mmunlearn-output"
#: the request history of a folder edited by several deletion requests
HISTORY_DIR = "undo_history"

#: Everything an output folder may hold besides the model's own files.
RESERVED: frozenset[str] = frozenset(
    {PATCH_NAME, ERASE_REPORT, PLOT_NAME, UNLEARN_REPORT, TILT_DIR, MARKER, HISTORY_DIR}
)


def check_not_reserved(name: str, listed_in: str | os.PathLike) -> str:
    """``name`` unless an output folder uses it for its own file (:data:`RESERVED`, compared without case,
    as a case-insensitive file system would); ValueError naming ``listed_in`` otherwise."""
    if name.casefold() in {r.casefold() for r in RESERVED}:
        raise ValueError(
            f"{listed_in} names the weight file {name!r}, a name mmunlearn writes into every output "
            f"folder ({', '.join(sorted(RESERVED))}): writing the output would overwrite it; rename "
            "the shard (and its entries in the index)"
        )
    return name
