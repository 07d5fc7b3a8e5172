"""Tables (Markdown, CSV, JSON) and the accuracy plot of the VoxCeleb2 recipe.

Accuracies and EER are fractions in the CSV/JSON and percentages in the Markdown table. At the speaker level,
"forget -> any forgotten" counts the forgotten speakers' utterances predicted as ANY forgotten speaker (plain forget
accuracy misses relabelling onto another forgotten speaker) and "largest share on one retained speaker" how much of
one forgotten speaker's audio lands on a single retained class (a "sink"); compare both with the retrained row.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.report import table
from mmunlearn.report.figures import figure

#: (header, row key, percent?) per level.
COLUMNS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "speaker": (
        ("forget acc %", "forget_acc", True),
        ("forget test acc %", "forget_test_acc", True),
        ("forget -> any forgotten %", "forget_any_acc", True),
        ("forget test -> any forgotten %", "forget_test_any_acc", True),
        ("largest share on one retained speaker %", "forget_sink_share", True),
        ("retain acc %", "retain_acc", True),
        ("test acc %", "test_acc", True),
        ("EER %", "eer", True),
        ("forget NLL", "forget_nll", False),
        ("retain NLL", "retain_nll", False),
        ("unlearn s", "unlearn_seconds", False),
        ("+ extraction s", "total_seconds", False),
        ("sweep s (all scopes)", "sweep_seconds", False),
        ("params changed", "changed_fraction", False),
        ("rule met", "target_reached", False),
        ("edited", "scope", False),
    ),
    "sample": (
        ("forget acc %", "forget_acc", True),
        ("holdout acc %", "holdout_acc", True),
        ("retain acc %", "retain_acc", True),
        ("test acc %", "test_acc", True),
        ("EER %", "eer", True),
        ("MIA AUC", "mia_auc", False),
        ("MIA AUC 95 % CI", "mia_auc_ci", False),
        ("forget NLL", "forget_nll", False),
        ("retain NLL", "retain_nll", False),
        ("unlearn s", "unlearn_seconds", False),
        ("+ extraction s", "total_seconds", False),
        ("sweep s (all scopes)", "sweep_seconds", False),
        ("params changed", "changed_fraction", False),
        ("rule met", "target_reached", False),
        ("edited", "scope", False),
    ),
}
#: Bars of the plot: (label, row key) per level.
BARS = {
    "speaker": (
        ("forget", "forget_acc"),
        ("forget test", "forget_test_acc"),
        ("retain", "retain_acc"),
        ("test", "test_acc"),
    ),
    "sample": (("forget", "forget_acc"), ("holdout", "holdout_acc"), ("retain", "retain_acc"), ("test", "test_acc")),
}


def _columns(level: str) -> tuple[tuple[str, str, bool], ...]:
    if level not in COLUMNS:
        raise ValueError(f"level must be one of {sorted(COLUMNS)}, got {level!r}")
    return COLUMNS[level]


def _cells(row: dict) -> dict:
    """The row with derived cells: the MIA interval as a pair."""
    if row.get("mia_auc_low") is not None and row.get("mia_auc_high") is not None:
        return {**row, "mia_auc_ci": (row["mia_auc_low"], row["mia_auc_high"])}
    return row


def sample_verdict(rows: list[dict]) -> str | None:
    """At the sample level, whether the benchmark can measure forgetting on this model: the original model's
    MIA AUC interval must exclude 0.5. A sentence saying so when it cannot; None when it can (or is unknown)."""
    original = next((r for r in rows if r.get("method") == "original model"), None)
    if original is None or original.get("mia_auc_low") is None:
        return None
    low, high = original["mia_auc_low"], original["mia_auc_high"]
    if low <= 0.5 <= high:
        return (
            f"The original model's MIA AUC is {original['mia_auc']:.3f} (95 % CI [{low:.3f}, {high:.3f}]), "
            "indistinguishable from chance: this model shows no membership signal, so the benchmark cannot "
            "measure sample forgetting on it and the MIA column does not rank the methods."
        )
    return None


def markdown(rows: list[dict], level: str) -> str:
    body = table([_cells(r) for r in rows], [("method", "method"), *_columns(level)])
    notes = missed_notes(rows)
    verdict = sample_verdict(rows) if level == "sample" else None
    if verdict:
        notes.append(verdict)
    return "\n".join([body, *([""] + notes if notes else [])])


def missed_notes(rows: list[dict]) -> list[str]:
    """Sentences naming the methods that missed their rule: those whose chosen model kept the retain measure within
    the bound (the setting closest to the target among such) apart from those that went over it (no tried setting
    stayed within the bound, or the run ended past it)."""
    missed = missed_targets(rows)
    over = [r["method"] for r in rows if r.get("target_reached") is False and r.get("within_bound") is False]
    inside = [m for m in missed if m not in over]
    notes = []
    if missed:
        notes.append(f"Sweep rule not met by: {', '.join(missed)}.")
    if inside:
        notes.append(
            f"{', '.join(inside)}: the chosen setting is the one closest to the target within the retain bound."
        )
    if over:
        notes.append(
            f"{', '.join(over)}: the chosen model is OVER the retain bound (no setting tried stayed within "
            "it while moving the forget measure)."
        )
    return notes


def missed_targets(rows: list[dict]) -> list[str]:
    """Methods whose sweep did not meet its rule (``target_reached`` False; None = no sweep)."""
    return [r["method"] for r in rows if r.get("target_reached") is False]


def write_tables(out: Path, rows: list[dict], level: str, context: dict) -> list[Path]:
    """``<level>.md``, ``<level>.csv`` and ``<level>.json`` in ``out`` (each written atomically)."""
    cols = _columns(level)
    paths = [out / f"{level}.md", out / f"{level}.csv", out / f"{level}.json"]
    write_text_atomic(paths[0], markdown(rows, level) + "\n")
    buf = io.StringIO()
    keys = [k for _, k, _ in cols if k != "mia_auc_ci"]
    if level == "sample":
        keys[keys.index("mia_auc") + 1 : keys.index("mia_auc") + 1] = ["mia_auc_low", "mia_auc_high"]
    writer = csv.DictWriter(buf, fieldnames=["method", *keys], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(paths[1], buf.getvalue())
    extra = {"sample_forgetting_measurable": sample_verdict(rows) is None} if level == "sample" else {}
    write_text_atomic(
        paths[2],
        json.dumps(
            {
                "level": level,
                "context": context,
                "rows": rows,
                "time": time.time(),
                "missed_targets": missed_targets(rows),
                **extra,
            },
            indent=2,
            default=str,
        ),
    )
    return paths


def plot_accuracies(path: Path, rows: list[dict], level: str, chance: float | None = None) -> Path:
    """Grouped bars: per method (original, retrained, each unlearning method) its accuracies; for the
    sample level a second panel with the MIA AUC (0.5 = no membership signal)."""
    import numpy as np

    bars = [(label, key) for label, key in BARS[level] if any(r.get(key) is not None for r in rows)]
    mia = level == "sample" and any(r.get("mia_auc") is not None for r in rows)
    x = np.arange(len(rows))
    width = 0.8 / max(1, len(bars))
    with figure(
        path,
        nrows=1,
        ncols=2 if mia else 1,
        squeeze=False,
        figsize=(max(7, 1.2 * len(rows) + 3) * (1.5 if mia else 1), 4.5),
        gridspec_kw={"width_ratios": [2, 1]} if mia else None,
    ) as (_, axes):
        ax = axes[0][0]
        for i, (label, key) in enumerate(bars):
            values = [100 * r[key] if r.get(key) is not None else np.nan for r in rows]
            ax.bar(x + (i - (len(bars) - 1) / 2) * width, values, width, label=label)
        if chance is not None:
            ax.axhline(100 * chance, color="gray", linestyle="--", linewidth=1, label="chance")
        ax.set_xticks(x, [r["method"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 105)
        ax.set_title(f"{level}-level forgetting: identification accuracy")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(True, axis="y", alpha=0.3)
        if mia:
            ax2 = axes[0][1]
            ax2.bar(
                x, [r["mia_auc"] if r.get("mia_auc") is not None else np.nan for r in rows], 0.6, color="tab:purple"
            )
            ax2.axhline(0.5, color="gray", linestyle="--", linewidth=1)
            ax2.set_xticks(x, [r["method"] for r in rows], rotation=30, ha="right", fontsize=8)
            ax2.set_ylim(0, 1)
            ax2.set_ylabel("MIA AUC (loss attack, forget vs holdout)")
            ax2.set_title("membership inference (0.5 = none)")
            ax2.grid(True, axis="y", alpha=0.3)
    return path
