"""Request history of an unlearning output: requests that compose, and undo patches that chain.

When a request edits a model folder that is itself an unlearning output, the new output carries the
earlier requests' undo patches and reports in ``undo_history/`` (``request-0001.safetensors`` and
``request-0001.json``, ...), its own patch stays ``undo_patch.safetensors``, and ``unlearn_report.json``
lists every request (``requests``: oldest first, with fingerprints of the weights before and after each).
``mmunlearn restore`` then undoes the latest request and writes the folder the request before it wrote
(weights bit for bit, that request's patch, report and history), so restoring again walks back to the
original model.

Those files are copied from the input folder into outputs, so each is opened as a side file is
(:func:`mmunlearn.files.safecopy.open_inside`: no link leaving the folder, no hard link, ``undo_history/`` no link
at all) and copied from the descriptor that was checked (:func:`mmunlearn.files.safecopy.copy_inside`), never by path.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmunlearn.erase.apply import PATCH_NAME
from mmunlearn.erase.patch import UndoPatch, revert_exact
from mmunlearn.errors import UnsafePathError
from mmunlearn.files.layout import HISTORY_DIR  # output names live in mmunlearn.files.layout
from mmunlearn.files.safecopy import copy_inside, open_inside, read_inside
from mmunlearn.files.undo_store import undo_dir_of
from mmunlearn.methods.harness import REPORT_NAME

#: the largest ``unlearn_report.json`` read (a report lists its requests: kilobytes, not megabytes)
REPORT_LIMIT = 64 << 20


def entry_name(index: int) -> str:
    """File stem of request ``index`` (1-based) in ``undo_history/``."""
    return f"request-{index:04d}"


def read_report(folder: str | os.PathLike) -> dict[str, Any] | None:
    """``unlearn_report.json`` of a folder (None when there is none); invalid JSON is an error naming it."""
    path = Path(folder) / REPORT_NAME
    if not os.path.lexists(path):
        return None
    try:
        report = json.loads(read_inside(folder, REPORT_NAME, REPORT_LIMIT))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be an unlearning report") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not an unlearning report (not a JSON object)")
    return report


@dataclass
class History:
    """The requests already applied to a model folder (oldest first) and where their undo records lie."""

    folder: Path
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: the folder that holds the undo patch and ``undo_history/`` (:mod:`mmunlearn.files.undo_store`: kept apart
    #: from the model; None: the model folder itself, as older outputs hold them)
    undo: Path | None = None

    @property
    def records(self) -> Path:
        """Where the undo patch and ``undo_history/`` lie."""
        return self.undo if self.undo is not None else self.folder

    @property
    def depth(self) -> int:
        return len(self.requests)

    def lineage(self, current: str) -> list[str]:
        """Fingerprints of the models ``current`` derives from (oldest first); empty unless ``current`` is
        the weights the last recorded request wrote (a folder edited since has no trusted lineage)."""
        if not self.requests or self.requests[-1].get("model_after") != current:
            return []
        return [r.get("model_before") for r in self.requests if r.get("model_before")]


def original_tensor(history: History, label: str, current: torch.Tensor) -> torch.Tensor | None:
    """The tensor ``label`` as it was before the first request of ``history``, from ``current`` (its value now) and
    the requests' undo patches, newest first (a request whose patch has no ``label`` entry left it as it was).
    None when a patch file is missing or ``current`` is not what the last request wrote (edited since)."""
    value = current.detach().cpu()
    for i in range(history.depth, 0, -1):
        path = history.records / (PATCH_NAME if i == history.depth else f"{HISTORY_DIR}/{entry_name(i)}.safetensors")
        if not path.is_file():
            return None
        try:
            for entry in reversed([e for e in UndoPatch.load(path).entries if e.label == label]):
                value = revert_exact(value, entry)
        except (ValueError, RuntimeError):  # another model's patch, weights edited since, a damaged record
            return None
    return value


def read_history(folder: str | os.PathLike) -> History:
    """The request history of ``folder``: its report's ``requests``, or one request for an output of the
    harness written without a history (report and undo patch), or none for a plain model folder."""
    folder = Path(folder)
    report = read_report(folder)
    undo = undo_dir_of(folder) if report is not None else None  # kept apart from the model (undo_store)
    if report is None or undo is None or not os.path.lexists(undo / PATCH_NAME):
        return History(folder)
    records = undo / HISTORY_DIR
    if os.path.lexists(records) and (records.is_symlink() or not records.is_dir()):
        raise UnsafePathError(
            f"{records} is a symbolic link or not a folder: the undo records in it are copied "
            "into outputs, so it must be a real folder inside the model folder"
        )
    requests = report.get("requests")
    if not isinstance(requests, list) or not requests:
        requests = [summary(report, index=1)]
    if not all(isinstance(r, dict) for r in requests):
        raise ValueError(f"{folder / REPORT_NAME}: requests must be a list of JSON objects")
    names = [PATCH_NAME]
    for i in range(1, len(requests)):
        for ext in ("safetensors", "json"):
            name = f"{HISTORY_DIR}/{entry_name(i)}.{ext}"
            if not os.path.lexists(undo / name):
                raise FileNotFoundError(f"{folder}: request {i}'s undo record {undo / name} is missing")
            names.append(name)
    for name in names:  # checked now, so a bad folder fails before any work; copied later from a new descriptor
        os.close(open_inside(undo, name, hard_links=False))
    return History(folder, [dict(r) for r in requests], None if undo == folder else undo)


def summary(unlearn_report: Mapping[str, Any], *, index: int, **more: Any) -> dict[str, Any]:
    """One request's line of the history, from its unlearning report."""
    keys = (
        "method",
        "forget_items",
        "retain_items",
        "extract_seconds",
        "unlearn_seconds",
        "target_reached",
        "forget_nll",
        "retain_nll",
    )
    return {"index": index, **{k: unlearn_report.get(k) for k in keys}, **more}


def carry_history(previous: History, staging: str | os.PathLike) -> None:
    """Copy ``previous``'s undo records into ``staging/undo_history`` (its own patch and report become the
    record of its last request)."""
    if not previous.requests:
        return
    dst = Path(staging) / HISTORY_DIR
    dst.mkdir(exist_ok=True)
    n, src = previous.depth, previous.records
    for i in range(1, n):
        for ext in ("safetensors", "json"):
            copy_inside(src, f"{HISTORY_DIR}/{entry_name(i)}.{ext}", dst / f"{entry_name(i)}.{ext}")
    copy_inside(src, PATCH_NAME, dst / f"{entry_name(n)}.safetensors")
    copy_inside(previous.folder, REPORT_NAME, dst / f"{entry_name(n)}.json")


def step_back(folder: str | os.PathLike, restored: str | os.PathLike) -> None:
    """Turn ``restored`` (the weights of ``folder`` with its latest request undone) into the folder the
    request before wrote: that request's undo patch, report and the older history."""
    folder, restored = Path(folder), Path(restored)
    history = read_history(folder)
    shutil.rmtree(restored / HISTORY_DIR, ignore_errors=True)
    n = history.depth
    if n < 2:
        return
    prev = entry_name(n - 1)
    for name in (PATCH_NAME, REPORT_NAME):  # restored holds this request's: replaced by the one before's
        (restored / name).unlink(missing_ok=True)
    src = history.records
    copy_inside(src, f"{HISTORY_DIR}/{prev}.safetensors", restored / PATCH_NAME)
    copy_inside(src, f"{HISTORY_DIR}/{prev}.json", restored / REPORT_NAME)
    if n > 2:
        (restored / HISTORY_DIR).mkdir()
        for i in range(1, n - 1):
            for ext in ("safetensors", "json"):
                copy_inside(
                    src, f"{HISTORY_DIR}/{entry_name(i)}.{ext}", restored / HISTORY_DIR / f"{entry_name(i)}.{ext}"
                )


def record(requests: Sequence[Mapping[str, Any]], report: Mapping[str, Any], **more: Any) -> list[dict[str, Any]]:
    """The history after one more request: ``requests`` with their undo records in ``undo_history/``, then
    the new request (its patch: ``undo_patch.safetensors``)."""
    out = []
    for i, r in enumerate(requests, 1):
        out.append(
            {
                **r,
                "index": i,
                "undo_patch": f"{HISTORY_DIR}/{entry_name(i)}.safetensors",
                "report": f"{HISTORY_DIR}/{entry_name(i)}.json",
            }
        )
    out.append(summary(report, index=len(requests) + 1, undo_patch=PATCH_NAME, report=REPORT_NAME, **more))
    return out


__all__ = [
    "HISTORY_DIR",
    "History",
    "carry_history",
    "entry_name",
    "original_tensor",
    "read_history",
    "read_report",
    "record",
    "step_back",
    "summary",
]
