"""TOFU log files: write ``TOFU_EVAL.json`` / ``TOFU_SUMMARY.json`` atomically, read a retain model's back.

Layout (that of open-unlearning's TOFU evaluator, so the files are interchangeable):

* ``TOFU_EVAL.json``: ``{key: entry}`` with the keys sorted and indented by 4, each entry as built
  by ``mmunlearn.metrics.entries`` (``{"agg_value": ..., "value_by_index": {"0": {...}, ...}}``;
  aggregate-only keys such as ``forget_quality`` have just ``agg_value``).
* ``TOFU_SUMMARY.json``: ``{key: agg_value}`` for every entry whose ``agg_value`` is not None.
  (The reference lists only the metrics configured at the top level; writing all of them is a
  superset with the same names and values.)

Forget quality and privleak compare with a *retain model* (trained without the forget set): the
reference reads that model's ``TOFU_EVAL.json`` (its ``retain_logs_path``) for the per-item
``forget_truth_ratio`` scores and the ``mia_min_k`` AUC; ``retain_forget_truth_ratios`` and
``retain_agg_value`` do the same here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.metrics.entries import per_item
from mmunlearn.metrics.keys import ALL_KEYS, RETAIN_LOGS_PRIVLEAK_KEY, RETAIN_LOGS_TRUTH_RATIO_KEY

EVAL_FILENAME = "TOFU_EVAL.json"
SUMMARY_FILENAME = "TOFU_SUMMARY.json"


def validate_logs(logs: Mapping[str, Any], strict_keys: bool = True) -> None:
    """Check a ``{key: entry}`` mapping; with ``strict_keys`` every key must be in ``ALL_KEYS``."""
    if not isinstance(logs, Mapping) or not logs:
        raise ValueError("logs: expected a non-empty mapping of metric key -> entry")
    for key, entry in logs.items():
        if not isinstance(key, str):
            raise ValueError(f"logs: metric keys must be str, got {key!r}")
        if strict_keys and key not in ALL_KEYS:
            raise ValueError(
                f"logs: unknown metric key {key!r} (pass strict_keys=False to allow it); "
                f"known keys: {', '.join(ALL_KEYS)}"
            )
        if not isinstance(entry, Mapping) or "agg_value" not in entry:
            raise ValueError(f"logs[{key!r}]: expected a mapping with an 'agg_value'")
        agg = entry["agg_value"]
        if agg is not None and not isinstance(agg, (int, float, np.floating, np.integer)):
            raise ValueError(f"logs[{key!r}]['agg_value']: expected a number or None, got {agg!r}")
        if "value_by_index" in entry and not isinstance(entry["value_by_index"], Mapping):
            raise ValueError(f"logs[{key!r}]['value_by_index']: expected a mapping")


def summarize(logs: Mapping[str, Any]) -> dict[str, float]:
    """``{key: agg_value}`` (keys sorted) for the entries whose ``agg_value`` is not None."""
    return {
        key: float(entry["agg_value"])
        for key, entry in sorted(logs.items())
        if isinstance(entry, Mapping) and entry.get("agg_value") is not None
    }


def _to_json(obj: Any) -> Any:
    """json ``default`` hook: numpy scalars and arrays to plain Python."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as JSON indented by 4 to ``path`` atomically (:func:`mmunlearn.files.atomic.write_text_atomic`).

    Unlike :func:`mmunlearn.files.atomic.write_json_atomic` it accepts numpy scalars and arrays and writes
    NaN and infinities as ``NaN`` / ``Infinity`` (Python's ``json`` default), so a metric value that
    came out NaN is logged rather than refused.
    """
    return write_text_atomic(path, json.dumps(obj, indent=4, default=_to_json))


def write_tofu_logs(
    out_dir: str | os.PathLike[str], logs: Mapping[str, Any], strict_keys: bool = True
) -> tuple[Path, Path]:
    """Write ``out_dir/TOFU_EVAL.json`` (all entries) and ``out_dir/TOFU_SUMMARY.json`` (aggregates).

    logs: ``{key: entry}``; keys must be among ``ALL_KEYS`` unless ``strict_keys`` is False.
    Returns the two paths. Each file is replaced atomically; existing files are overwritten.
    """
    validate_logs(logs, strict_keys)
    out = Path(out_dir)
    eval_path = write_json_atomic(out / EVAL_FILENAME, dict(sorted(logs.items())))
    summary_path = write_json_atomic(out / SUMMARY_FILENAME, summarize(logs))
    return eval_path, summary_path


def _eval_file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / EVAL_FILENAME if p.is_dir() else p


def read_tofu_logs(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a ``TOFU_EVAL.json`` (``path`` is the file or the directory holding it)."""
    file = _eval_file(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"TOFU eval logs not found: {file} (pass a {EVAL_FILENAME} or the directory holding it)"
        )
    try:
        logs = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(logs, dict):
        raise ValueError(f"{file}: expected a JSON object of metric key -> entry")
    return logs


def _retain_entry(path: str | os.PathLike[str], key: str) -> Mapping[str, Any]:
    logs = read_tofu_logs(path)
    entry = logs.get(key)
    if not isinstance(entry, Mapping):
        raise ValueError(
            f"{_eval_file(path)}: no {key!r} entry (has: {', '.join(sorted(logs)) or 'nothing'}); "
            f"evaluate the retain model with {key} first"
        )
    return entry


def retain_forget_truth_ratios(retain_logs_path: str | os.PathLike[str]) -> np.ndarray:
    """The retain model's per-item forget-set truth ratios, ``(N,)`` in index order.

    retain_logs_path: the retain model's ``TOFU_EVAL.json`` (or its directory). Reads the ``score``
    of every item of its ``forget_truth_ratio`` entry, as the reference's ``forget_quality`` does.
    """
    entry = _retain_entry(retain_logs_path, RETAIN_LOGS_TRUTH_RATIO_KEY)
    try:
        return per_item(entry, "score")
    except ValueError as exc:
        raise ValueError(f"{_eval_file(retain_logs_path)}: {RETAIN_LOGS_TRUTH_RATIO_KEY}: {exc}") from None


def retain_agg_value(retain_logs_path: str | os.PathLike[str], key: str = RETAIN_LOGS_PRIVLEAK_KEY) -> float:
    """An aggregate of the retain model's logs; by default its ``mia_min_k`` AUC (for privleak)."""
    entry = _retain_entry(retain_logs_path, key)
    value = entry.get("agg_value")
    if value is None:
        raise ValueError(f"{_eval_file(retain_logs_path)}: {key!r} has no agg_value")
    return float(value)
