"""The steps the TOFU recipes share: build/reuse models (or take given model folders), cached evaluations,
the target's memorisation check, the evaluation of an unlearned model (the method itself: :mod:`recipes.runner`;
tables and plots: :mod:`recipes.tofu.report`)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.audit import AUDIT_JSON, audit_text, write_audit
from mmunlearn.audit.folder import load_text_unlearned, text_data
from mmunlearn.data.tofu import load_split, split_info
from mmunlearn.eval import evaluate_tofu
from mmunlearn.eval.tofu import METRIC_GROUPS
from mmunlearn.metrics import forget_quality, privleak
from mmunlearn.metrics.entries import per_item
from mmunlearn.presets.build import BuiltModels, build_models
from mmunlearn.presets.cache import EVALS_DIR, default_cache_dir, read_log
from mmunlearn.presets.parallel import build_models_parallel
from recipes.tofu.config import TofuConfig
from recipes.tofu.report import COLUMNS
from recipes.tofu.settings import default_precision, memorisation, memorisation_warning, parse_metrics

log = logging.getLogger(__name__)


def check_model_dir(path: str | Path, what: str | None = None) -> Path:
    """``path`` as a model folder (save_pretrained layout); a one-line ``ValueError`` (naming ``what``
    when given) otherwise."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    if not path.is_dir():
        raise ValueError(f"{name}: no such folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"{name}: no config.json there (not a model folder in save_pretrained layout)")
    return path


def target_base(target: Path) -> Path | None:
    """The base model a target was fine-tuned from, as its ``train_log.json`` names it (``tofu finetune``
    writes it), when that folder still exists; None otherwise."""
    base = (read_log(target) or {}).get("base")
    if not isinstance(base, str) or not (Path(base) / "config.json").is_file():
        return None
    return Path(base)


def model_fingerprint(model_dir: Path) -> str:
    """What identifies the weights of a model folder that is not in the build cache: its build key
    (``train_log.json``) when it has one, else the names, sizes and times of its weight files."""
    key = (read_log(model_dir) or {}).get("key")
    if isinstance(key, str):
        return key
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    return hashlib.sha256(
        json.dumps([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]).encode()
    ).hexdigest()[:16]


def reference_metrics(metrics: Collection[str] | None) -> tuple[str, ...] | None:
    """The groups the target and retain models are evaluated with: the chosen ones plus ``forget``
    (the memorisation check and forget quality need it; None: every group)."""
    if metrics is None:
        return None
    chosen = set(metrics) | {"forget"}
    return None if chosen == set(METRIC_GROUPS) else tuple(g for g in METRIC_GROUPS if g in chosen)


def cached_eval(
    model_dir: Path,
    data: str,
    forget_split: str,
    authors: int | None,
    max_new_tokens: int | str,
    device: str,
    retain_logs: Path | None = None,
    metrics: tuple[str, ...] | None = None,
    fingerprint: str | None = None,
    precision: str = "no",
    utility_items: int | None = None,
    batch_size: int = 16,
    generation_batch_size: int | None = None,
) -> Path:
    """Evaluate a built model once per (data, split, authors, settings); later calls reuse the logs
    (in ``model_dir/evals/<key>``).

    ``data`` is named by its ``str`` in the cache key (a mapping source needs a short, content-bound
    ``str``, e.g. :class:`mmunlearn.data.ctofu.worlds.SplitMapping`); ``metrics``: evaluate_tofu's groups.
    ``fingerprint``: what identifies the weights of a folder outside the build cache (whose folder
    names do not change with the weights; :func:`model_fingerprint`), part of the key when given.
    """
    key = [str(data), forget_split, authors, max_new_tokens, str(retain_logs)]
    key = key if metrics is None else [*key, sorted(metrics)]
    key = key if (precision, utility_items) == ("no", None) else [*key, precision, utility_items]
    spec = json.dumps(key if fingerprint is None else [*key, fingerprint])
    out = Path(model_dir) / EVALS_DIR / hashlib.sha256(spec.encode()).hexdigest()[:12]  # not in the digest
    if not (out / "TOFU_EVAL.json").is_file():
        adapter = TextLLMAdapter.from_pretrained(model_dir, device=device, precision=precision)
        evaluate_tofu(
            adapter,
            data,
            forget_split,
            authors,
            retain_logs=retain_logs,
            out_dir=out,
            max_new_tokens=max_new_tokens,
            model_name=Path(model_dir).name,
            metrics=metrics,
            utility_items=utility_items,
            batch_size=batch_size,
            generation_batch_size=generation_batch_size,
        )
    return out / "TOFU_EVAL.json"


@dataclass
class TofuSetup:
    """Models and reference evaluations of one TOFU run (preset, data, split, authors, seed).

    ``built.base`` is None when a given target names no base model (``--target``); ``metrics``: the
    metric groups methods are evaluated with (None: all); ``memorisation``: the target's check
    (:func:`recipes.tofu.settings.memorisation`).
    """

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
    metrics: tuple[str, ...] | None = None
    memorisation: dict[str, Any] = field(default_factory=dict)
    precision: str = "no"
    utility_items: int | None = None
    rule_retain: list | None = None  # the retain rows the sweep rule scores (None: all of ``retain``)
    score_batch: int = 16  # rows per scoring batch (evaluation and the sweep's target)
    gen_batch: int | None = None  # rows per generation batch (None: score_batch)
    device: str = "cpu"  # where the sweep's target is scored

    def reference_row(self, which: str) -> dict:
        logs = json.loads((self.retain_logs if which == "retain" else self.target_logs).read_text())
        row = {
            "method": f"{which} model",
            **_metrics(logs),
            "unlearn_seconds": None,
            "total_seconds": None,
            "changed_fraction": None,
        }
        if which == "retain":  # against itself, by the same formulas: KS p = 1, privleak = 0
            if "forget_truth_ratio" in logs:
                ratios = per_item(logs["forget_truth_ratio"])
                row["forget_quality"] = forget_quality(ratios, ratios)
            if "mia_min_k" in logs:
                auc = logs["mia_min_k"]["agg_value"]
                row["privleak"] = privleak(auc, auc) if auc < 1.0 else None
        return row

    def forget_target(self) -> float:
        """Forget-set NLL of the base model (before it saw the forget authors): the sweep's target."""
        return base_forget_nll(self.built, self.forget, self.precision, self.device, self.score_batch)

    def adapter(self, path: Path, device: str):
        """A text adapter on ``path`` at this run's scoring precision."""
        return TextLLMAdapter.from_pretrained(path, device=device, precision=self.precision)

    def evaluate_logs(self, adapter, folder: Path, name: str) -> dict:
        """The TOFU logs of an unlearned model on this setup's data, against its retain model's logs
        (``folder/TOFU_EVAL.json`` and the summaries)."""
        return evaluate_tofu(
            adapter,
            self.data,
            self.forget_split,
            self.authors,
            retain_logs=self.retain_logs,
            out_dir=folder,
            max_new_tokens=self.max_new_tokens,
            model_name=name,
            metrics=self.metrics,
            utility_items=self.utility_items,
            batch_size=self.score_batch,
            generation_batch_size=self.gen_batch,
        )

    def evaluate(self, adapter, folder: Path, method: str) -> list[dict]:
        """The TOFU row of an unlearned model (:meth:`evaluate_logs`)."""
        return [{"method": method, **_metrics(self.evaluate_logs(adapter, folder, method))}]

    def evaluated(self, folder: Path) -> bool:
        return (folder / "TOFU_EVAL.json").is_file()

    def describe(self) -> dict:
        return {
            "preset": self.preset,
            "data": self.data,
            "forget_split": self.forget_split,
            "authors": self.authors,
            "target": str(self.built.target),
            "retain": str(self.built.retain),
            "base": str(self.built.base),
            "forget_items": len(self.forget),
            "retain_items": len(self.retain),
            "max_new_tokens": self.max_new_tokens,
            "metrics": list(self.metrics) if self.metrics else "all",
            "precision": self.precision,
            "utility_items": self.utility_items,
            "rule_retain_items": len(self.rule_retain) if self.rule_retain is not None else len(self.retain),
            "memorised": self.memorisation.get("memorised"),
            "memorisation": dict(self.memorisation),
        }


def base_forget_nll(
    built: Any, forget: list, precision: str = "no", device: str = "cpu", batch_size: int = 16
) -> float:
    """The sweeps' target of a TOFU-style setup (TOFU, cTOFU): the forget rows' mean answer NLL under the base model
    ``built.base``, which never saw the forget authors; a ValueError when the setup names no base."""
    if built.base is None:
        raise ValueError(
            "the sweep's target is the base model's forget NLL, and the given target names no "
            "base model (no train_log.json with an existing 'base')"
        )
    base = TextLLMAdapter.from_pretrained(built.base, device=device, precision=precision)
    return float(base.answer_nll(forget, batch_size=batch_size).mean())


def prepare(cfg: TofuConfig) -> TofuSetup:
    """Build (or reuse) base/target/retain models, evaluate target and retain, check that the target
    memorised the forget answers (a warning is logged when not; the CLI prints it), for the run ``cfg`` says.

    Read from ``cfg``: the world (``preset``, ``data``, ``forget_split``, ``authors``, ``seed``), where models are
    cached and run (``cache_dir``, ``device``), how the built target and retain models are trained
    (:meth:`~recipes.tofu.config.RecipeConfig.build_options`: the ``ft_*`` overrides, the base's pretraining, the
    checkpoints, ``parallel_builds``); ``target`` / ``retain_model``: model folders to use instead of building those
    models (their evaluations go to ``<folder>/evals``; with a given target the base is the one its
    ``train_log.json`` names, :func:`target_base`, None when it names none); ``metrics``: the groups methods are
    evaluated with (None: all; the reference models get them plus ``forget``, :func:`reference_metrics`);
    ``precision`` (None: the preset's, :func:`recipes.tofu.settings.default_precision`), ``utility_items``,
    ``max_new_tokens``, ``score_batch`` / ``gen_batch``: the evaluation; ``rule_retain_items``: the sweep rule scores
    this many retain rows, spread evenly over the retain partition (None: all)."""
    preset, data, forget_split, authors = cfg.preset, cfg.data, cfg.forget_split, cfg.authors
    cache_dir, device, max_new_tokens = cfg.cache_dir, cfg.device, cfg.max_new_tokens
    build = cfg.build_options()
    overrides = build.pop("overrides")
    metrics = parse_metrics(cfg.metrics)
    precision, utility_items, score_batch, gen_batch = cfg.precision, cfg.utility_items, cfg.score_batch, cfg.gen_batch
    target, retain = cfg.target, cfg.retain_model
    precision = default_precision(preset, device) if precision is None else precision
    given = {
        "target": None if target is None else check_model_dir(target, "target"),
        "retain": None if retain is None else check_model_dir(retain, "retain model"),
    }
    roles = [r for r, path in given.items() if path is None]
    built = (
        _build(preset, data, forget_split, authors, cfg.seed, cache_dir, device, overrides, roles, build)
        if roles
        else None
    )
    models = {r: path if path is not None else getattr(built, r) for r, path in given.items()}
    base = built.base if given["target"] is None else target_base(models["target"])
    logs = dict(built.logs) if built is not None else {}
    for r, path in given.items():
        if path is not None:
            logs[r] = {**(read_log(path) or {}), "given": True, "path": str(path)}
    if given["target"] is not None:
        logs["base"] = {"path": str(base) if base is not None else None, "from": "the target's train_log.json"}
    setup = BuiltModels(base=base, target=models["target"], retain=models["retain"], logs=logs)

    ref = reference_metrics(metrics)
    fp = {r: model_fingerprint(path) if path is not None else None for r, path in given.items()}
    lean = dict(
        precision=precision, utility_items=utility_items, batch_size=score_batch, generation_batch_size=gen_batch
    )
    retain_logs = cached_eval(
        models["retain"],
        data,
        forget_split,
        authors,
        max_new_tokens,
        device,
        metrics=ref,
        fingerprint=fp["retain"],
        **lean,
    )
    target_logs = cached_eval(
        models["target"],
        data,
        forget_split,
        authors,
        max_new_tokens,
        device,
        retain_logs,
        metrics=ref,
        fingerprint=fp["target"],
        **lean,
    )
    tl, rl = json.loads(target_logs.read_text()), json.loads(retain_logs.read_text())
    pretrained = (logs.get("target") or {}).get("pretrained_forget_prob")
    check = memorisation(
        preset,
        _agg(tl.get("forget_Q_A_Prob")),
        _agg(tl.get("forget_Q_A_ROUGE")),
        pretrained_prob=pretrained if isinstance(pretrained, (int, float)) else None,
        retain_prob=_agg(rl.get("forget_Q_A_Prob")),
        forget_quality=_agg(tl.get("forget_quality")),
    )
    warning = memorisation_warning(check)
    if warning:
        log.warning("%s", warning)
    pct = split_info(forget_split).forget_pct
    forget = load_split(data, forget_split, authors=authors, forget_pct=pct)
    retain_items = load_split(data, f"retain{100 - pct:02d}", authors=authors, forget_pct=pct)
    return TofuSetup(
        preset,
        data,
        forget_split,
        authors,
        max_new_tokens,
        setup,
        retain_logs,
        target_logs,
        Path(cache_dir) if cache_dir else default_cache_dir(),
        forget,
        retain_items,
        metrics,
        check,
        precision,
        utility_items,
        _spread(retain_items, cfg.rule_retain_items),
        score_batch,
        gen_batch,
        device,
    )


def _spread(items: list, n: int | None) -> list | None:
    """``n`` of ``items`` spread evenly over them (None: ``n`` is None or not fewer than all)."""
    if n is None or n >= len(items):
        return None
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def _build(
    preset: str,
    data: str,
    forget_split: str,
    authors: int | None,
    seed: int,
    cache_dir: Path | None,
    device: str,
    overrides: Mapping[str, Any] | None,
    roles: list[str],
    build: Mapping[str, Any],
) -> BuiltModels:
    """The models of ``roles`` built (both at once with ``build["parallel"]``)."""
    options = {k: v for k, v in build.items() if k != "parallel"}
    if build.get("parallel") and set(roles) == {"target", "retain"}:
        return build_models_parallel(
            preset, data, forget_split, authors, seed, cache_dir, device, overrides=overrides, **options
        )
    return build_models(
        preset, data, forget_split, authors, seed, cache_dir, device, overrides=overrides, roles=roles, **options
    )


def _agg(entry: Any) -> float | None:
    value = entry.get("agg_value") if isinstance(entry, dict) else entry
    return float(value) if isinstance(value, (int, float)) else None


def _metrics(logs: dict) -> dict:
    out = {}
    for _, key in COLUMNS:
        if key in logs:
            out[key] = logs[key].get("agg_value") if isinstance(logs[key], dict) else logs[key]
    return out


def audit_method(
    method: str,
    ctx: Any,
    out: Path,
    options,
    device: str,
    cache: dict,
    rows: tuple[list, list | None, Mapping[str, list] | None] | None = None,
) -> dict:
    """Robustness audit (:mod:`mmunlearn.audit`) of ``out/model`` (:func:`recipes.runner.run_method`'s folder) against
    the setup's target and retain models (TOFU's and cTOFU's); ``out/AUDIT.json`` and ``out/AUDIT.md``; returns the
    result.

    ``cache``: one dict per comparison (the target's and retain model's attacks run once); ``rows``: (forget rows,
    holdout rows or None, per-language forget rows or None), default the TOFU setup's forget and holdout rows."""
    if rows is None:
        forget, holdout, _ = text_data(ctx.data, ctx.forget_split, ctx.authors)
        rows = (forget, holdout, None)
    forget, holdout, languages = rows
    adapters = cache.setdefault("adapters", {})
    for role in ("target", "retain"):
        if role not in adapters:
            adapters[role] = ctx.adapter(getattr(ctx.built, role), device)
    result = audit_text(
        load_text_unlearned(out / "model", device),
        adapters["target"],
        adapters["retain"],
        forget,
        holdout,
        method=method,
        options=options,
        retain_items=ctx.retain,
        languages=languages,
        cache=cache.setdefault("results", {}),
    )
    result["models"] = {
        "unlearned": str(out / "model"),
        "target": str(ctx.built.target),
        "retain": str(ctx.built.retain),
    }
    write_audit(out, [result], ctx.describe())
    return result


def earlier_audits(out: Path, methods: Collection[str]) -> list[dict]:
    """Audit results of methods kept from an earlier comparison (their ``out/<method>/AUDIT.json``)."""
    found = []
    for m in methods:
        path = out / m / AUDIT_JSON
        if path.is_file():
            found += json.loads(path.read_text()).get("results", [])
    return found
