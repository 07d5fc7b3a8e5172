"""The steps the TOFU recipes share: build/reuse models, cached evaluations, one method's row, tables, plot."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.data.tofu import load_split, split_info

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
    ("unlearn s", "unlearn_seconds"),
    ("+ extraction s", "total_seconds"),
    ("params changed", "changed_fraction"),
    ("rule met", "target_reached"),
)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cached_eval(model_dir: Path, data: str, forget_split: str, authors: int | None, max_new_tokens: int,
                device: str, retain_logs: Path | None = None, metrics: tuple[str, ...] | None = None) -> Path:
    """Evaluate a built model once per (data, split, authors, settings); later calls reuse the logs.

    ``data`` is named by its ``str`` in the cache key (a mapping source needs a short, content-bound
    ``str``, e.g. :class:`mmunlearn.data.ctofu.SplitMapping`); ``metrics``: evaluate_tofu's groups.
    """
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.eval import evaluate_tofu

    key = [str(data), forget_split, authors, max_new_tokens, str(retain_logs)]
    spec = json.dumps(key if metrics is None else [*key, sorted(metrics)])
    out = Path(model_dir) / "evals" / hashlib.sha256(spec.encode()).hexdigest()[:12]
    if not (out / "TOFU_EVAL.json").is_file():
        adapter = TextLLMAdapter.from_pretrained(model_dir, device=device)
        evaluate_tofu(adapter, data, forget_split, authors, retain_logs=retain_logs, out_dir=out,
                      max_new_tokens=max_new_tokens, model_name=Path(model_dir).name, metrics=metrics)
    return out / "TOFU_EVAL.json"


@dataclass
class Context:
    """Models and reference evaluations of one (preset, data, split, authors, seed)."""

    preset: str
    data: str
    forget_split: str
    authors: int | None
    max_new_tokens: int
    built: Any  # BuiltModels
    retain_logs: Path
    target_logs: Path
    cache_dir: Path
    forget: list
    retain: list

    def reference_row(self, which: str) -> dict:
        logs = json.loads((self.retain_logs if which == "retain" else self.target_logs).read_text())
        row = {"method": f"{which} model", **_metrics(logs), "unlearn_seconds": None, "total_seconds": None,
               "changed_fraction": None}
        if which == "retain":  # against itself, by the same formulas: KS p = 1, privleak = 0
            from mmunlearn.metrics import forget_quality, privleak
            from mmunlearn.metrics.entries import per_item

            ratios = per_item(logs["forget_truth_ratio"])
            row["forget_quality"] = forget_quality(ratios, ratios)
            auc = logs["mia_min_k"]["agg_value"]
            row["privleak"] = privleak(auc, auc) if auc < 1.0 else None
        return row

    def forget_target(self) -> float:
        """Forget-set NLL of the base model (before it saw the forget authors): the sweep's target."""
        from mmunlearn.adapters.text_llm import TextLLMAdapter

        base = TextLLMAdapter.from_pretrained(self.built.base, device="cpu")
        return float(base.answer_nll(self.forget).mean())

    def describe(self) -> dict:
        return {"preset": self.preset, "data": self.data, "forget_split": self.forget_split, "authors": self.authors,
                "target": str(self.built.target), "retain": str(self.built.retain), "base": str(self.built.base),
                "forget_items": len(self.forget), "retain_items": len(self.retain),
                "max_new_tokens": self.max_new_tokens}


def prepare(preset: str, data: str, forget_split: str, authors: int | None, seed: int, cache_dir: Path | None,
            device: str, max_new_tokens: int) -> Context:
    """Build (or reuse) base/target/retain models and their evaluations."""
    from mmunlearn.presets.build import build_models
    from mmunlearn.presets.cache import default_cache_dir

    built = build_models(preset, data, forget_split, authors, seed, cache_dir, device)
    retain_logs = cached_eval(built.retain, data, forget_split, authors, max_new_tokens, device)
    target_logs = cached_eval(built.target, data, forget_split, authors, max_new_tokens, device, retain_logs)
    pct = split_info(forget_split).forget_pct
    forget = load_split(data, forget_split, authors=authors, forget_pct=pct)
    retain = load_split(data, f"retain{100 - pct:02d}", authors=authors, forget_pct=pct)
    return Context(preset, data, forget_split, authors, max_new_tokens, built, retain_logs, target_logs,
                   Path(cache_dir) if cache_dir else default_cache_dir(), forget, retain)


def _metrics(logs: dict) -> dict:
    out = {}
    for _, key in COLUMNS:
        if key in logs:
            out[key] = logs[key].get("agg_value") if isinstance(logs[key], dict) else logs[key]
    return out


def _reference(ctx: Context, base: str, device: str):
    from mmunlearn.adapters.text_llm import TextLLMAdapter

    if base == "target":
        return None
    path = ctx.built.base if base == "base" else Path(base)
    return TextLLMAdapter.from_pretrained(path, device=device)


def run_method_row(method: str, ctx: Context, options: dict, rule, base: str, out: Path, device: str) -> dict:
    """Unlearn with ``method`` on a fresh copy of the target through the harness (``out/model``: the
    harness's layout, restorable), evaluate it (``out/TOFU_EVAL.json``); returns the table row."""
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.eval import evaluate_tofu
    from mmunlearn.methods import run_unlearning

    from recipes.tofu_settings import method_options, preset_size

    target = TextLLMAdapter.from_pretrained(ctx.built.target, device=device)
    outcome = run_unlearning(method, target, ctx.forget, ctx.retain, kind="text", size=preset_size(ctx.preset),
                             overrides=method_options(method, **options), reference=_reference(ctx, base, device),
                             rule=rule, out=out / "model", inputs=[ctx.built.target], overwrite=True,
                             cache_dir=str(ctx.cache_dir), meta={"model_dir": str(ctx.built.target)})
    logs = evaluate_tofu(outcome.adapter, ctx.data, ctx.forget_split, ctx.authors, retain_logs=ctx.retain_logs,
                         out_dir=out, max_new_tokens=ctx.max_new_tokens, model_name=method)
    rep = outcome.report
    df = rep["forget_nll"]["after"] - rep["forget_nll"]["before"]
    dr = rep["retain_nll"]["after"] - rep["retain_nll"]["before"]
    row = {"method": method, **_metrics(logs), "unlearn_seconds": rep["unlearn_seconds"],
           "total_seconds": rep["unlearn_seconds"] + rep["extract_seconds"], "changed_fraction": rep["changed_fraction"],
           # training partitions: how much more the forget answers' NLL rose than the retain answers'
           "forget_nll_rise": df, "retain_nll_rise": dr, "selectivity": df / dr if dr > 1e-6 else None,
           "target_reached": rep["target_reached"]}
    _write_atomic(out / "run.json", json.dumps({"row": row, "info": rep["info"], "context": ctx.describe()},
                                               indent=2, default=str))
    return row


def earlier_rows(out: Path, context: dict, exclude: list[str]) -> list[dict]:
    """Method rows of an earlier ``compare.json`` in ``out`` with the same context, except ``exclude``."""
    path = out / "compare.json"
    if not path.is_file():
        return []
    earlier = json.loads(path.read_text())
    if earlier.get("context") != json.loads(json.dumps(context)):
        return []
    return [r for r in earlier["rows"] if not r["method"].endswith(" model") and r["method"] not in exclude]


def ordered(rows: list[dict]) -> list[dict]:
    """Reference rows first, then methods in the registry's order."""
    from mmunlearn.methods import names

    rank = {m: i for i, m in enumerate(names())}
    return sorted(rows, key=lambda r: (-1 if r["method"].endswith(" model") else rank.get(r["method"], len(rank)),
                                       r["method"] != "target model"))


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4):
            return f"{value:.2e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown(rows: list[dict]) -> str:
    head = "| method | " + " | ".join(h for h, _ in COLUMNS) + " |"
    sep = "|---|" + "---:|" * len(COLUMNS)
    body = ["| " + r["method"] + " | " + " | ".join(_fmt(r.get(k)) for _, k in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def write_tables(out: Path, rows: list[dict], context: dict) -> None:
    """compare.md, compare.csv and compare.json (each written atomically)."""
    _write_atomic(out / "compare.md", markdown(rows) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["method", *(k for _, k in COLUMNS)], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    _write_atomic(out / "compare.csv", buf.getvalue())
    _write_atomic(out / "compare.json", json.dumps({"context": context, "rows": rows, "time": time.time()}, indent=2))


def selectivity_plot(path: Path, out: Path, methods: list[str], forget_target: float | None) -> Path | None:
    """Forget vs retain NLL (training partitions) along each method's sweep: erasure scale,
    T3 temperature, baseline epochs. Reads ``out/<method>/run.json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    drawn = 0
    for m in methods:
        run = out / m / "run.json"
        if not run.is_file():
            continue
        points = json.loads(run.read_text())["info"].get("sweep") or []
        key = next((k for k in ("scale", "temperature", "step") if points and k in points[0]), None)
        points = sorted(points, key=lambda p: p[key]) if key else points
        if points:
            ax.plot([p["retain_nll"] for p in points], [p["forget_nll"] for p in points], marker="o", label=m)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    if forget_target is not None:
        ax.axhline(forget_target, color="gray", linestyle="--", linewidth=1, label="forget NLL target (base model)")
    ax.set_xlabel("retain NLL (training partition)")
    ax.set_ylabel("forget NLL (training partition)")
    ax.set_title("Selectivity along each method's sweep (up and left is better)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def scatter(path: Path, rows: list[dict]) -> Path:
    """Forget quality (log scale) against model utility; target and retain models marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in rows:
        fq, mu = r.get("forget_quality"), r.get("model_utility")
        if fq is None or mu is None or not math.isfinite(fq):
            continue
        ref = r["method"].endswith("model")
        ax.scatter(mu, max(fq, 1e-30), marker="*" if ref else "o", s=160 if ref else 60,
                   color="black" if ref else None, zorder=3)
        ax.annotate(r["method"], (mu, max(fq, 1e-30)), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("model utility")
    ax.set_ylabel("forget quality (KS p-value, log scale)")
    ax.set_title("TOFU: forget quality vs model utility")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
