"""The real-LLM TOFU goals checked on a finished `tofu compare` folder: wall time, the target's forget quality
(does the table separate?), QR-Erase's and T3's forget quality, utility and forget ROUGE-L against the retain
model's, and QR-Erase's cost against GradDiff's time to the same forget NLL.

Reads ``compare.json`` and each method's ``run.json`` (the sweep trajectory of an early-stopped baseline holds
the training-partition forget NLL every few steps), prints a table and writes a JSON of rows that
``mmunlearn report record`` takes::

    python examples/tofu_goals.py runs/smollm2_tofu --json runs/smollm2_goals.json
    python examples/tofu_goals.py runs/smollm2_tofu20 --wall-goal-min 150 --json runs/smollm2_tofu20_goals.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmunlearn.files.atomic import write_text_atomic

WALL_GOAL_MIN = 90.0
MIN_FORGET_QUALITY = 0.05
MIN_UTILITY_RATIO = 0.9
MAX_COST_RATIO = 0.2
#: the QR-Erase issue's (46) cost goal: its extraction + sweep + edit at most this share of GradDiff's time to the
#: rule's forget target (each method stops there; a GradDiff stopped at the target never reaches a higher NLL)
MAX_COST_RATIO_TO_TARGET = 1 / 3
#: the target's forget quality against the retain model at or below which the table separates the models
MAX_TARGET_FORGET_QUALITY = 0.01
#: a method's forget ROUGE-L at most this far from the retain model's
MAX_ROUGE_GAP = 0.1


def _row(goal: str, measured: str, target: str, met: bool | None) -> dict:
    return {"goal": goal, "measured": measured, "target": target, "met": met}


def time_to_forget_nll(run: dict, forget_nll: float) -> float | None:
    """Seconds a trained method took until its training-partition forget NLL first reached ``forget_nll``
    (its unlearn time prorated by steps; None when it never did)."""
    points = run["info"].get("sweep") or []
    steps = run["info"].get("steps") or (points[-1]["step"] if points else None)
    seconds = run["row"].get("unlearn_seconds")
    first = next((p for p in points if p["forget_nll"] >= forget_nll), None)
    if first is None or not steps or seconds is None:
        return None
    return seconds * first["step"] / steps


def goals(
    folder: Path, wall: float | None = None, setup: float | None = None, wall_goal_min: float = WALL_GOAL_MIN
) -> list[dict]:
    comp = json.loads((folder / "compare.json").read_text())
    rows = {r["method"]: r for r in comp["rows"]}
    ctx = comp["context"]
    out = []
    wall = ctx.get("wall_seconds") if wall is None else wall  # a resumed run's own wall time is only its last part
    out.append(
        _row(
            "whole compare wall time",
            "n/a" if wall is None else f"{wall / 60:.1f} min",
            f"<= {wall_goal_min:.0f} min",
            None if wall is None else wall / 60 <= wall_goal_min,
        )
    )
    target_fq = rows["target model"].get("forget_quality")
    out.append(
        _row(
            "target model: forget quality (the table separates)",
            "n/a" if target_fq is None else f"{target_fq:.3g}",
            f"<= {MAX_TARGET_FORGET_QUALITY}",
            None if target_fq is None else target_fq <= MAX_TARGET_FORGET_QUALITY,
        )
    )
    stages = [
        r.get("extract_seconds", 0) + r.get("unlearn_seconds", 0) + r.get("eval_seconds", 0)
        for m, r in rows.items()
        if not m.endswith(" model")
    ]
    if setup is not None and all(isinstance(x, (int, float)) for x in stages):
        total = setup + sum(stages)
        out.append(
            _row(
                "sum of every stage's time (models + each method), one process",
                f"{total / 60:.1f} min",
                f"<= {wall_goal_min:.0f} min",
                total / 60 <= wall_goal_min,
            )
        )
    target_mu = rows["target model"].get("model_utility")
    retain_rouge = rows.get("retain model", {}).get("forget_Q_A_ROUGE")
    for m in ("qr-erase", "t3"):
        r = rows.get(m)
        if r is None:
            continue
        fq, mu = r.get("forget_quality"), r.get("model_utility")
        ratio = mu / target_mu if mu is not None and target_mu else None
        out.append(
            _row(
                f"{m}: forget quality",
                "n/a" if fq is None else f"{fq:.3g}",
                f">= {MIN_FORGET_QUALITY}",
                None if fq is None else fq >= MIN_FORGET_QUALITY,
            )
        )
        out.append(
            _row(
                f"{m}: model utility / target's",
                "n/a" if ratio is None else f"{ratio:.3f}",
                f">= {MIN_UTILITY_RATIO}",
                None if ratio is None else ratio >= MIN_UTILITY_RATIO,
            )
        )
        rouge = r.get("forget_Q_A_ROUGE")
        gap = rouge - retain_rouge if rouge is not None and retain_rouge is not None else None
        out.append(
            _row(
                f"{m}: forget ROUGE-L - the retain model's",
                "n/a" if gap is None else f"{rouge:.3f} - {retain_rouge:.3f} = {gap:+.3f}",
                f"within {MAX_ROUGE_GAP}",
                None if gap is None else abs(gap) <= MAX_ROUGE_GAP,
            )
        )
    qr, gd = folder / "qr-erase" / "run.json", folder / "grad_diff" / "run.json"
    if qr.is_file() and gd.is_file():
        qr_run, gd_run = json.loads(qr.read_text()), json.loads(gd.read_text())
        qr_cost = qr_run["row"]["total_seconds"]
        # the edited model's forget NLL on the training partition, as the harness measured it
        qr_nll = json.loads((folder / "qr-erase" / "model" / "unlearn_report.json").read_text())["forget_nll"]["after"]
        gd_time = time_to_forget_nll(gd_run, qr_nll)
        ratio = qr_cost / gd_time if gd_time else None
        out.append(
            _row(
                "qr-erase extraction + sweep + edit / grad_diff's time to the same forget NLL",
                f"{qr_cost:.0f} s / " + ("never reached" if gd_time is None else f"{gd_time:.0f} s = {ratio:.2f}"),
                f"<= {MAX_COST_RATIO}",
                None if ratio is None else ratio <= MAX_COST_RATIO,
            )
        )
        target = qr_run["rule"]["forget_target"]
        gd_time = time_to_forget_nll(gd_run, target)
        ratio = qr_cost / gd_time if gd_time and qr_run["rule"]["forget"] >= target else None
        out.append(
            _row(
                f"qr-erase extraction + sweep + edit / grad_diff's time to the rule's forget target ({target:.3g})",
                f"{qr_cost:.0f} s / "
                + ("never reached" if gd_time is None else f"{gd_time:.0f} s")
                + ("" if ratio is None else f" = {ratio:.2f}"),
                f"<= {MAX_COST_RATIO_TO_TARGET:.3g}",
                None if ratio is None else ratio <= MAX_COST_RATIO_TO_TARGET,
            )
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="A finished `tofu compare --out` folder.")
    p.add_argument(
        "--wall-seconds",
        type=float,
        help="The comparison's wall time when it was resumed (the "
        "compare.json of the last, resumed call holds only its own).",
    )
    p.add_argument(
        "--setup-seconds",
        type=float,
        help="The models' stage (build and evaluation), from the log's "
        "'[stage 1/..]' line: with it the sum of every stage is reported.",
    )
    p.add_argument(
        "--wall-goal-min",
        type=float,
        default=WALL_GOAL_MIN,
        help=f"The wall-time goal in minutes (default {WALL_GOAL_MIN:.0f}).",
    )
    p.add_argument("--json", type=Path, help="Write {'columns', 'rows'} here for `mmunlearn report record`.")
    args = p.parse_args()
    rows = goals(args.folder, args.wall_seconds, args.setup_seconds, args.wall_goal_min)
    for r in rows:
        print(
            f"{r['goal']}: {r['measured']} (goal {r['target']}): "
            + {True: "met", False: "MISSED", None: "not measured"}[r["met"]]
        )
    if args.json:
        columns = [["goal", "goal"], ["measured", "measured"], ["goal value", "target"], ["met", "met"]]
        write_text_atomic(args.json, json.dumps({"columns": columns, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
