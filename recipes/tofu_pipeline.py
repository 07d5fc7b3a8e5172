"""The steps the TOFU recipes share: build/reuse models, cached evaluations, one method's row (tables and plots:
:mod:`recipes.tofu_report`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.data.tofu import load_split, split_info

from mmunlearn.atomic import write_text_atomic
from recipes.tofu_report import COLUMNS

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
class TofuSetup:
    """Models and reference evaluations of one TOFU run (preset, data, split, authors, seed)."""

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
            device: str, max_new_tokens: int) -> TofuSetup:
    """Build (or reuse) base/target/retain models and their evaluations."""
    from mmunlearn.presets.build import build_models
    from mmunlearn.presets.cache import default_cache_dir

    built = build_models(preset, data, forget_split, authors, seed, cache_dir, device)
    retain_logs = cached_eval(built.retain, data, forget_split, authors, max_new_tokens, device)
    target_logs = cached_eval(built.target, data, forget_split, authors, max_new_tokens, device, retain_logs)
    pct = split_info(forget_split).forget_pct
    forget = load_split(data, forget_split, authors=authors, forget_pct=pct)
    retain = load_split(data, f"retain{100 - pct:02d}", authors=authors, forget_pct=pct)
    return TofuSetup(preset, data, forget_split, authors, max_new_tokens, built, retain_logs, target_logs,
                   Path(cache_dir) if cache_dir else default_cache_dir(), forget, retain)


def _metrics(logs: dict) -> dict:
    out = {}
    for _, key in COLUMNS:
        if key in logs:
            out[key] = logs[key].get("agg_value") if isinstance(logs[key], dict) else logs[key]
    return out


def _reference(ctx: TofuSetup, base: str, device: str):
    from mmunlearn.adapters.text_llm import TextLLMAdapter

    if base == "target":
        return None
    path = ctx.built.base if base == "base" else Path(base)
    return TextLLMAdapter.from_pretrained(path, device=device)


def run_method_row(method: str, ctx: TofuSetup, options: dict, rule, base: str, out: Path, device: str) -> dict:
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
    write_text_atomic(out / "run.json", json.dumps({"row": row, "info": rep["info"], "context": ctx.describe()},
                                               indent=2, default=str))
    return row


