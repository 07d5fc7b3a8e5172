"""cTOFU results as Markdown and JSON (method x language matrices, transfer summary, full table) and heatmaps."""

from __future__ import annotations

import math
import textwrap
import time
from pathlib import Path

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.metrics.logs import write_json_atomic
from mmunlearn.report import table
from mmunlearn.report.figures import figure
from recipes.ctofu.pipeline import COLUMNS


def _order(rows: list[dict], field: str) -> list[str]:
    return list(dict.fromkeys(r[field] for r in rows))


def matrix(rows: list[dict], key: str) -> str:
    """Markdown table method x language of one metric."""
    langs = _order(rows, "lang")
    pivot: dict[str, dict] = {}
    for r in rows:
        pivot.setdefault(r["method"], {"method": r["method"]})[r["lang"]] = r.get(key)
    return table(list(pivot.values()), [("method", "method"), *((lang, lang) for lang in langs)])


#: the transfer summary's columns (:func:`recipes.ctofu.pipeline.transfer_summary`)
TRANSFER_COLUMNS = (
    ("method", "method"),
    ("rel. ROUGE-L drop, forget lang", "rouge_drop_forget_lang"),
    ("rel. ROUGE-L drop, other langs", "rouge_drop_other_langs"),
    ("transfer (ROUGE-L)", "rouge_transfer"),
    ("transfer (prob)", "prob_transfer"),
    ("FQ forget lang", "fq_forget_lang"),
    ("mean FQ other langs", "fq_other_langs"),
    ("mean MU", "mu_mean"),
    ("verdict", "verdict"),
)


#: the measures QR-Erase and SVD-UNLEARN are set side by side on (the QR-Erase paper's claim: within 5 % of SVD on
#: every metric at a fraction of its time)
PAIR_MEASURES = ("model_utility", "rouge_drop", "prob_ratio")


def qr_vs_svd(rows: list[dict], qr: str = "qr-erase", svd: str = "svd-unlearn") -> list[dict]:
    """Per language where both ran: each measure of :data:`PAIR_MEASURES` and forget quality for both methods, the
    largest relative difference of the measures (|qr - svd| / |svd|) and QR-Erase's stage time over SVD's."""
    by = {(r["method"], r["lang"]): r for r in rows}
    out = []
    for lang in _order(rows, "lang"):
        a, b = by.get((qr, lang)), by.get((svd, lang))
        if a is None or b is None:
            continue
        entry: dict = {"lang": lang}
        diffs = []
        for key in ("forget_quality", *PAIR_MEASURES):
            entry[f"qr_{key}"], entry[f"svd_{key}"] = a.get(key), b.get(key)
            x, y = a.get(key), b.get(key)
            if key != "forget_quality" and x is not None and y is not None and y != 0:
                diffs.append(abs(x - y) / abs(y))
        entry["max_rel_diff"] = max(diffs) if diffs else None
        ta, tb = a.get("total_seconds"), b.get("total_seconds")
        entry["time_ratio"] = ta / tb if ta is not None and tb else None
        out.append(entry)
    return out


PAIR_COLUMNS = (
    ("lang", "lang"),
    ("FQ qr", "qr_forget_quality"),
    ("FQ svd", "svd_forget_quality"),
    ("MU qr", "qr_model_utility"),
    ("MU svd", "svd_model_utility"),
    ("ROUGE-L drop qr", "qr_rouge_drop"),
    ("ROUGE-L drop svd", "svd_rouge_drop"),
    ("prob after/before qr", "qr_prob_ratio"),
    ("prob after/before svd", "svd_prob_ratio"),
    ("largest rel. diff", "max_rel_diff"),
    ("time qr / svd", "time_ratio"),
)


def transfer_table(summary: list[dict]) -> str:
    return table(summary, TRANSFER_COLUMNS)


def long_table(rows: list[dict]) -> str:
    return table(rows, [("method", "method"), ("lang", "lang"), *COLUMNS])


def markdown(rows: list[dict], summary: list[dict], forget_langs: tuple[str, ...]) -> str:
    forget = ", ".join(forget_langs)
    return (
        "\n\n".join(
            [
                f"### Forget quality (KS p-value vs the retain model, per language); forget data in: {forget}",
                matrix(rows, "forget_quality"),
                "### Forget ROUGE-L drop (target model minus this model, per language)",
                matrix(rows, "rouge_drop"),
                "### Forget-set probability after / before (this model's over the target's, per language: the transfer "
                "matrix)",
                matrix(rows, "prob_ratio"),
                "### Cross-lingual transfer (relative drops: 1 - value / target's value)",
                transfer_table(summary),
                *(
                    [
                        "### QR-Erase beside SVD-UNLEARN (largest relative difference of MU, ROUGE-L drop and prob "
                        "ratio; time "
                        "of the stage)",
                        table(pair, PAIR_COLUMNS),
                    ]
                    if (pair := qr_vs_svd(rows))
                    else []
                ),
                "### Every method x every language",
                long_table(rows),
            ]
        )
        + "\n"
    )


def write_report(
    out: Path, stem: str, rows: list[dict], summary: list[dict], forget_langs: tuple[str, ...], context: dict
) -> tuple[Path, Path]:
    """``<stem>.md`` and ``<stem>.json`` in ``out`` (each written atomically)."""
    md = write_text_atomic(out / f"{stem}.md", markdown(rows, summary, forget_langs))
    js = write_json_atomic(
        out / f"{stem}.json",
        {"context": context, "rows": rows, "transfer": summary, "qr_vs_svd": qr_vs_svd(rows), "time": time.time()},
    )
    return md, js


def heatmap(path: Path, rows: list[dict], key: str, title: str, *, log10: bool = False, cmap: str = "viridis") -> Path:
    """A method x language heatmap of ``key`` (log10 of it with ``log10``), values written in the cells."""
    import numpy as np

    methods, langs = _order(rows, "method"), _order(rows, "lang")
    cell = {(r["method"], r["lang"]): r.get(key) for r in rows}
    grid = np.full((len(methods), len(langs)), np.nan)
    for i, m in enumerate(methods):
        for j, lang in enumerate(langs):
            v = cell.get((m, lang))
            if v is not None and math.isfinite(v):
                grid[i, j] = math.log10(max(v, 1e-30)) if log10 else v
    with figure(path, figsize=(max(5.0, 2.2 + 0.7 * len(langs)), 1.4 + 0.42 * len(methods))) as (fig, ax):
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(langs)), langs)
        ax.set_yticks(range(len(methods)), methods)
        for i in range(len(methods)):
            for j in range(len(langs)):
                if np.isfinite(grid[i, j]):
                    ax.text(
                        j,
                        i,
                        f"{grid[i, j]:.1f}" if log10 else f"{grid[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if grid[i, j] < np.nanmean(grid) else "black",
                    )
        fig.colorbar(im, ax=ax, label=("log10 " if log10 else "") + key)
        ax.set_title(textwrap.fill(title, 60), fontsize=9)
    return path
