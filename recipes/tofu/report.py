"""Tables and plots of the TOFU recipes: the comparison table (Markdown, CSV, JSON), the forget-quality vs
utility scatter and the selectivity plot along each method's sweep."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path

from mmunlearn.audit import write_audit
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods import names
from mmunlearn.report import fmt as _fmt
from mmunlearn.report import table
from mmunlearn.report.figures import figure

#: Columns of the comparison table: (header, TOFU log key or row field).
COLUMNS = (
    ("forget quality", "forget_quality"),
    ("model utility", "model_utility"),
    ("MU-ROUGE", "model_utility_rouge"),
    ("forget ROUGE-L", "forget_Q_A_ROUGE"),
    ("forget truth ratio", "forget_truth_ratio"),
    ("forget prob", "forget_Q_A_Prob"),
    ("retain prob", "retain_Q_A_Prob"),
    ("privleak", "privleak"),
    ("forget NLL rise", "forget_nll_rise"),
    ("retain NLL rise", "retain_nll_rise"),
    ("selectivity", "selectivity"),
    ("extract s", "extract_seconds"),
    ("sweep s", "sweep_seconds"),
    ("edit/train s", "edit_seconds"),
    ("unlearn total s", "total_seconds"),
    ("eval s", "eval_seconds"),
    ("params changed", "changed_fraction"),
    ("rule met", "target_reached"),
)


#: context entries that say how long the calls took (not what the rows were measured on)
TIMES = ("wall_seconds", "timing")


def earlier_rows(out: Path, context: dict, exclude: list[str]) -> list[dict]:
    """Method rows of an earlier ``compare.json`` in ``out`` with the same context, except ``exclude``."""
    path = out / "compare.json"
    if not path.is_file():
        return []
    earlier = json.loads(path.read_text())
    # the calls' times are not part of what the rows were measured on
    same = {k: v for k, v in (earlier.get("context") or {}).items() if k not in TIMES}
    if same != {k: v for k, v in json.loads(json.dumps(context)).items() if k not in TIMES}:
        return []
    return [r for r in earlier["rows"] if not r["method"].endswith(" model") and r["method"] not in exclude]


def ordered(rows: list[dict]) -> list[dict]:
    """Reference rows first, then methods in the registry's order."""
    rank = {m: i for i, m in enumerate(names())}
    return sorted(
        rows,
        key=lambda r: (
            -1 if r["method"].endswith(" model") else rank.get(r["method"], len(rank)),
            r["method"] != "target model",
        ),
    )


def markdown(rows: list[dict]) -> str:
    return table(rows, [("method", "method"), *COLUMNS])


def memorisation_line(context: dict) -> str:
    """The target's memorisation check under the table (empty when the context has none)."""
    check = context.get("memorisation") or {}
    if check.get("memorised") is None:
        return ""
    prob, rouge = check.get("forget_prob"), check.get("forget_rouge")
    facts = [f"forget answer probability {_fmt(prob)} (>= {check.get('min_forget_prob')})"]
    for name in ("pretrained", "retain"):
        if check.get(f"{name}_prob") is not None:
            facts.append(f"{name} model's {_fmt(check[f'{name}_prob'])}")
    if check.get("min_forget_rouge") is not None:
        facts.append(f"forget ROUGE-L {_fmt(rouge)} (>= {check['min_forget_rouge']})")
    verdict = "yes" if check["memorised"] else "NO (" + "; ".join(check.get("failed") or []) + ")"
    return f"\nTarget memorised the forget answers: {verdict}; " + ", ".join(facts) + "." + time_line(context) + "\n"


def time_line(context: dict) -> str:
    """The tables' line on time: this call's wall time, and when stages were reused from earlier calls, how many
    and what they took when they ran (a resumed comparison's own wall time is not the whole run's)."""
    wall = context.get("wall_seconds")
    if not isinstance(wall, (int, float)):
        return ""
    stages = (context.get("timing") or {}).get("stages") or []
    reused = [st for st in stages if st.get("reused")]
    if not reused:
        return f"\nWhole command: {wall / 60:.1f} min wall."
    known = [st["seconds"] for st in reused if isinstance(st.get("seconds"), (int, float))]
    took = f"; they took {sum(known) / 60:.1f} min when they ran" + (
        "" if len(known) == len(reused) else f" ({len(reused) - len(known)} not recorded)"
    )
    return (
        f"\nThis call: {wall / 60:.1f} min wall; {len(reused)} of {len(stages)} stages reused from earlier "
        f"calls{took if known else ' (their times not recorded)'}."
    )


def write_tables(out: Path, rows: list[dict], context: dict) -> None:
    """compare.md, compare.csv and compare.json (each written atomically)."""
    write_text_atomic(out / "compare.md", markdown(rows) + "\n" + memorisation_line(context))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["method", *(k for _, k in COLUMNS)], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(out / "compare.csv", buf.getvalue())
    columns = [["method", "method"], *([h, k] for h, k in COLUMNS)]  # what `mmunlearn report` renders
    write_text_atomic(
        out / "compare.json",
        json.dumps({"context": context, "columns": columns, "rows": rows, "time": time.time()}, indent=2),
    )


def write_audit_table(out: Path, results: list[dict], context: dict) -> Path:
    """AUDIT.json and AUDIT.md of a comparison (:func:`mmunlearn.audit.write_audit`), methods in the
    registry's order."""
    rank = {m: i for i, m in enumerate(names())}
    return write_audit(out, sorted(results, key=lambda r: rank.get(r["method"], len(rank))), context)


def selectivity_plot(path: Path, out: Path, methods: list[str], forget_target: float | None) -> Path | None:
    """Forget vs retain NLL (training partitions) along each method's sweep: erasure scale,
    T3 temperature, baseline epochs. Reads ``out/<method>/run.json``; None (no file) when no method swept."""
    series = {}
    for m in methods:
        run = out / m / "run.json"
        if not run.is_file():
            continue
        points = json.loads(run.read_text())["info"].get("sweep") or []
        points = [p for p in points if p.get("retain_nll") is not None]  # a lazy erasure sweep's forget-only points
        key = next((k for k in ("scale", "temperature", "step") if points and k in points[0]), None)
        if points:
            series[m] = sorted(points, key=lambda p: p[key]) if key else points
    if not series:
        return None
    with figure(path, figsize=(7, 5)) as (_, ax):
        for m, points in series.items():
            ax.plot([p["retain_nll"] for p in points], [p["forget_nll"] for p in points], marker="o", label=m)
        if forget_target is not None:
            ax.axhline(forget_target, color="gray", linestyle="--", linewidth=1, label="forget NLL target (base model)")
        ax.set_xlabel("retain NLL (training partition)")
        ax.set_ylabel("forget NLL (training partition)")
        ax.set_title("Selectivity along each method's sweep (up and left is better)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    return path


def scatter(path: Path, rows: list[dict]) -> Path:
    """Forget quality (log scale) against model utility; target and retain models marked."""
    with figure(path, figsize=(7, 5)) as (_, ax):
        for r in rows:
            fq, mu = r.get("forget_quality"), r.get("model_utility")
            if fq is None or mu is None or not math.isfinite(fq):
                continue
            ref = r["method"].endswith("model")
            ax.scatter(
                mu,
                max(fq, 1e-30),
                marker="*" if ref else "o",
                s=160 if ref else 60,
                color="black" if ref else None,
                zorder=3,
            )
            ax.annotate(r["method"], (mu, max(fq, 1e-30)), textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("model utility")
        ax.set_ylabel("forget quality (KS p-value, log scale)")
        ax.set_title("TOFU: forget quality vs model utility")
        ax.grid(True, alpha=0.3)
    return path
