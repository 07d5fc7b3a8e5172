"""The audit's table and files: one row per model (:func:`summary` for the unlearned one, :func:`reference_rows`
for the target and retain models), the markdown table, and AUDIT.json / AUDIT.md written atomically."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.report import table

AUDIT_JSON = "AUDIT.json"
AUDIT_MD = "AUDIT.md"

#: Columns of the audit table: (header, summary key). "kept" = forgetting kept under the attack, relative to
#: the retain model under the same attack (1 = as retrained, 0 = as the target).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("forget", "forget"),
    ("kept", "kept_none"),
    ("kept: paraphrase", "kept_paraphrase"),
    ("kept: 8-bit", "kept_quantise_8bit"),
    ("kept: 4-bit", "kept_quantise_4bit"),
    ("kept: relearn", "kept_relearn"),
    ("relearn: gap recovered", "relearn_recovered"),
    ("relearn recovery ratio", "relearn_recovery_ratio"),
    ("ROUGE-L kept: 4-bit", "rouge_kept_quantise_4bit"),
    ("ROUGE-L kept: relearn", "rouge_kept_relearn"),
    ("NLL kept: 4-bit", "nll_kept_quantise_4bit"),
    ("NLL kept: relearn", "nll_kept_relearn"),
    ("probe acc", "probe_accuracy"),
    ("probe kept", "kept_probe"),
    ("weights = target", "weights_equal_target"),
)


def summary(result: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The table row of an audit: the unlearned model's plain measure, the forgetting kept under each attack
    (on ``key``), the relearning recovery ratio, the probe's accuracy and kept share."""
    attacks = result["attacks"]
    row: dict[str, Any] = {"method": result["method"], "measure": key, "forget": attacks["none"]["unlearned"].get(key)}
    for name, res in attacks.items():
        if name == "probe":
            row["probe_accuracy"] = res["unlearned"]["accuracy"]
            row["kept_probe"] = res["kept"]["accuracy"]
        else:
            row[f"kept_{name}"] = res["kept"].get(key)
    if "relearn" in attacks:
        row["relearn_recovered"] = attacks["relearn"]["recovered"]["unlearned"].get(key)
        row["relearn_recovery_ratio"] = attacks["relearn"]["recovery_ratio"].get(key)
    for measure, prefix in (("forget_rouge", "rouge"), ("forget_nll", "nll")):  # greedy answers; the finer NLL
        if measure in attacks["none"]["unlearned"]:
            for name in ("quantise_4bit", "relearn"):
                if name in attacks:
                    row[f"{prefix}_kept_{name}"] = attacks[name]["kept"].get(measure)
    row["weights_equal_target"] = result["white_box"]["weights_equal_target"]
    return row


def reference_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of the target and retain models (their measures; "kept" is 0 and 1 by definition)."""
    key = result["summary"]["measure"]
    attacks = result["attacks"]
    rows = []
    for role, value in (("target", 0.0), ("retain", 1.0)):
        row = {"method": f"{role} model", "measure": key, "forget": attacks["none"][role].get(key)}
        for name in attacks:
            row["kept_probe" if name == "probe" else f"kept_{name}"] = value
            for measure, prefix in (("forget_rouge", "rouge"), ("forget_nll", "nll")):
                if name in ("quantise_4bit", "relearn") and measure in attacks["none"][role]:
                    row[f"{prefix}_kept_{name}"] = value
        if "probe" in attacks:
            row["probe_accuracy"] = attacks["probe"][role]["accuracy"]
        if role == "retain" and "relearn" in attacks:
            row["relearn_recovered"] = attacks["relearn"]["recovered"]["retain"].get(key)
        rows.append(row)
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The audit table; columns of attacks no row ran are left out; language columns are added when present."""
    extra = sorted({k for r in rows for k in r if k.startswith("kept_language_")})
    columns = [*COLUMNS[:3], *((f"kept: {k.removeprefix('kept_language_')}", k) for k in extra), *COLUMNS[3:]]
    columns = [(h, k) for h, k in columns if any(r.get(k) is not None for r in rows)]
    measure = next((r.get("measure") for r in rows if r.get("measure")), "forget_prob")
    return table(
        rows, [("method", "method"), *((h if k != "forget" else measure.replace("_", " "), k) for h, k in columns)]
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def write_audit(
    out: str | Path, results: Sequence[Mapping[str, Any]], context: Mapping[str, Any] | None = None
) -> Path:
    """AUDIT.json (every result, with ``context``) and AUDIT.md (the table, target and retain rows first) in
    ``out``, each written atomically; returns the JSON's path."""
    out = Path(out)
    rows = (reference_rows(results[0]) if results else []) + [r["summary"] for r in results]
    write_text_atomic(
        out / AUDIT_JSON,
        json.dumps(
            _jsonable({"context": dict(context or {}), "results": list(results), "rows": rows, "time": time.time()}),
            indent=2,
        ),
    )
    notes = sorted({r["white_box"]["note"] for r in results if r["white_box"].get("note")})
    text = [
        "# Robustness audit",
        "",
        markdown(rows),
        "",
        "kept = (target - model) / (target - retain model), each measured after the same attack: 1 = as forgotten "
        "as retraining, 0 = as the target. relearn gap recovered = (after - before) / (target - before) of the "
        "model's own forgotten gap; relearn recovery ratio = that share over the retain model's (1 = relearns "
        "like a model that never saw the data; large when the retain model recovers almost nothing).",
        *(["", *notes] if notes else []),
    ]
    write_text_atomic(out / AUDIT_MD, "\n".join(text) + "\n")
    return out / AUDIT_JSON
