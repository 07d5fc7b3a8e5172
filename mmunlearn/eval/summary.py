"""Markdown summaries of TOFU logs: one model's headline metrics, or several models side by side.

Both tables take logs as written by ``evaluate_tofu`` (``{key: {"agg_value": ...}}``), summaries
(``{key: value}``) or paths to a ``TOFU_EVAL.json`` / ``TOFU_SUMMARY.json`` or a directory holding
one, so they also work on logs of the reference evaluator.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.metrics.logs import EVAL_FILENAME, SUMMARY_FILENAME
from mmunlearn.report import table

SUMMARY_MD_FILENAME = "TOFU_SUMMARY.md"

# (key, label): the headline rows, in display order. Arrows say which way is better.
HEADLINE: tuple[tuple[str, str], ...] = (
    ("forget_quality", "Forget quality (KS p-value) ↑"),
    ("model_utility", "Model utility ↑"),
    ("model_utility_rouge", "MU-ROUGE ↑"),
    ("forget_Q_A_ROUGE", "Forget ROUGE-L recall ↓"),
    ("forget_Q_A_Prob", "Forget prob ↓"),
    ("forget_truth_ratio", "Forget truth ratio (min(R, 1/R)) ↑"),
    ("retain_Q_A_Prob", "Retain prob ↑"),
    ("retain_Q_A_ROUGE", "Retain ROUGE-L recall ↑"),
    ("retain_Truth_Ratio", "Retain truth ratio ↑"),
    ("privleak", "PrivLeak (→ 0)"),
    ("mia_min_k", "MIA min-k AUC (→ retain model's)"),
    ("extraction_strength", "Extraction strength ↓"),
    ("exact_memorization", "Exact memorisation ↓"),
)


def _agg(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("agg_value")
    return None if value is None else float(value)


def _load(logs: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(logs, Mapping):
        return logs
    path = Path(logs)
    if path.is_dir():
        path = next((path / n for n in (EVAL_FILENAME, SUMMARY_FILENAME) if (path / n).is_file()), path / EVAL_FILENAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"TOFU logs not found: {path} (pass a {EVAL_FILENAME}, a {SUMMARY_FILENAME} or a directory holding one)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of metric key -> value")
    return data


def summary_table(logs: Mapping[str, Any] | str | os.PathLike[str]) -> str:
    """Markdown table ``| Metric | Key | Value |`` of the headline metrics present in ``logs``.

    Keys absent from the logs are left out; keys present with ``agg_value: None`` (forget quality
    and privleak without retain logs) show ``n/a``.
    """
    data = _load(logs)
    rows = [{"label": label, "key": f"`{key}`", "value": _agg(data[key])} for key, label in HEADLINE if key in data]
    if not rows:
        raise ValueError("summary_table: none of the headline TOFU metrics are in the logs")
    return table(rows, [("Metric", "label"), ("Key", "key"), ("Value", "value")]) + "\n"


def compare_table(
    models: Mapping[str, Mapping[str, Any] | str | os.PathLike[str]], keys: tuple[tuple[str, str], ...] = HEADLINE
) -> str:
    """Markdown table with one column per model (e.g. ``{"target": ..., "retain": ..., "unlearned": ...}``).

    models: name -> logs (mapping or path, as ``summary_table``), in column order.
    keys: (key, label) rows; a row appears when at least one model has the key, ``—`` where a model
    lacks it, ``n/a`` where its value is None.
    """
    if not models:
        raise ValueError("compare_table: no models given")
    loaded = {name: _load(logs) for name, logs in models.items()}
    rows = [
        {"label": label, **{i: _agg(data[key]) for i, data in enumerate(loaded.values()) if key in data}}
        for key, label in keys
        if any(key in data for data in loaded.values())
    ]
    if not rows:
        raise ValueError("compare_table: none of the requested metrics are in any of the logs")
    return table(rows, [("Metric", "label"), *((str(name), i) for i, name in enumerate(loaded))], missing="—") + "\n"


def write_summary_md(
    out_dir: str | os.PathLike[str], logs: Mapping[str, Any], model_name: str, settings: Mapping[str, Any] | None = None
) -> Path:
    """Write ``out_dir/TOFU_SUMMARY.md``: a title, the headline table and the evaluation settings."""
    parts = [f"# TOFU evaluation: {model_name}\n", summary_table(logs)]
    if any(_agg(logs.get(k)) is None for k in ("forget_quality", "privleak") if k in logs):
        parts.append(
            "n/a: needs the retain model's logs (`--retain-logs`), evaluated with the forget "
            "(forget quality) and mia (privleak) metrics.\n"
        )
    if settings:
        parts.append("## Settings\n")
        for k, v in settings.items():
            if isinstance(v, Mapping):
                v = ", ".join(f"{name} {n}" for name, n in v.items())
            parts.append(f"- {k}: {v}")
        parts.append("")
    return write_text_atomic(Path(out_dir) / SUMMARY_MD_FILENAME, "\n".join(parts))
