"""The steps of the cTOFU recipe: models of a multilingual world, per-language cached evaluations, one
method's rows (one per evaluation language), and the cross-lingual transfer summary.

Model building, the cached evaluation and the method's run are the TOFU recipe's
(:mod:`recipes.tofu.pipeline`, :func:`mmunlearn.presets.build.build_models`, :func:`recipes.runner.run_method`);
the world's data is a dict source
(:class:`mmunlearn.data.ctofu.worlds.SplitMapping`) so both read it unchanged.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.data.ctofu.worlds import World
from mmunlearn.metrics.logs import read_tofu_logs, summarize
from mmunlearn.presets.cache import default_cache_dir
from mmunlearn.presets.parallel import build_models_parallel
from recipes.tofu.pipeline import TofuSetup, base_forget_nll, cached_eval
from recipes.tofu.pipeline import audit_method as tofu_audit
from recipes.tofu.settings import default_precision, memorisation

# no MIA: the translations ship no holdout split (its non-members)
EVAL_GROUPS = ("forget", "memorization", "utility")
#: per-language metrics of a row: (header, key)
COLUMNS = (
    ("forget quality", "forget_quality"),
    ("forget ROUGE-L", "forget_Q_A_ROUGE"),
    ("ROUGE-L drop", "rouge_drop"),
    ("forget truth ratio", "forget_truth_ratio"),
    ("forget prob", "forget_Q_A_Prob"),
    ("forget prob after / before", "prob_ratio"),
    ("model utility", "model_utility"),
    ("retain ROUGE-L", "retain_Q_A_ROUGE"),
)
MIN_DROP = 0.1  # a relative forget ROUGE-L drop below this in the forget language(s) is "no forgetting"


def _summary(logs_path: Path) -> dict[str, float]:
    return summarize(read_tofu_logs(logs_path))


@dataclass
class CrossLingualSetup:
    """A cTOFU run composed of TOFU: one :class:`~recipes.tofu.pipeline.TofuSetup` per evaluation language (that
    language's data and reference logs, the world's shared models), the forget rows of the forget languages and the
    retain rows of the retain languages; a method's rows are one TOFU evaluation per language."""

    preset: str
    world: World
    forget_langs: tuple[str, ...]
    retain_langs: tuple[str, ...]
    by_lang: dict[str, TofuSetup]
    forget: list
    retain: list

    @property
    def eval_langs(self) -> tuple[str, ...]:
        return tuple(self.by_lang)

    @property
    def built(self) -> Any:  # BuiltModels, shared by every language
        return next(iter(self.by_lang.values())).built

    @property
    def precision(self) -> str:  # scoring precision, the same in every language
        return next(iter(self.by_lang.values())).precision

    @property
    def cache_dir(self) -> Path:
        return next(iter(self.by_lang.values())).cache_dir

    def reference_rows(self, which: str) -> list[dict]:
        """The target or retain model's row per evaluation language (the retain model's forget quality
        is 1 by definition: KS of its truth ratios against themselves)."""
        rows = []
        for lang, tofu in self.by_lang.items():
            logs = _summary(tofu.retain_logs if which == "retain" else tofu.target_logs)
            if which == "retain":
                logs["forget_quality"] = 1.0
            rows.append(make_row(f"{which} model", lang, logs, _summary(tofu.target_logs)))
        return rows

    def memorisation(self) -> dict[str, dict[str, Any]]:
        """Per evaluation language, whether the target memorised that language's forget rows
        (:func:`recipes.tofu.settings.memorisation` on its forget probability and ROUGE-L against the retain model's
        probability): a language it did not memorise is reported, not hidden."""
        out = {}
        for lang, tofu in self.by_lang.items():
            target, retain = _summary(tofu.target_logs), _summary(tofu.retain_logs)
            out[lang] = memorisation(
                self.preset,
                target.get("forget_Q_A_Prob"),
                target.get("forget_Q_A_ROUGE"),
                retain_prob=retain.get("forget_Q_A_Prob"),
            )
        return out

    def forget_target(self) -> float:
        """Forget-set NLL of the base model (which never saw the forget authors): the sweeps' target, at the scoring
        precision."""
        first = next(iter(self.by_lang.values()))
        return base_forget_nll(self.built, self.forget, self.precision, first.device, first.score_batch)

    def adapter(self, path: Path, device: str):
        """A text adapter on ``path`` at the scoring precision (every language's TOFU setup has the same)."""
        return next(iter(self.by_lang.values())).adapter(path, device)

    def evaluate(self, adapter, folder: Path, method: str) -> list[dict]:
        """One row per evaluation language of an unlearned model (``folder/<lang>/TOFU_EVAL.json``)."""
        rows = []
        for lang, tofu in self.by_lang.items():
            logs = tofu.evaluate_logs(adapter, folder / lang, f"{method} ({lang})")
            summary = {
                k: v["agg_value"] for k, v in logs.items() if isinstance(v, dict) and v.get("agg_value") is not None
            }
            rows.append(make_row(method, lang, summary, _summary(tofu.target_logs)))
        return rows

    def evaluated(self, folder: Path) -> bool:
        return all(tofu.evaluated(folder / lang) for lang, tofu in self.by_lang.items())

    def describe(self) -> dict:
        return {
            "preset": self.preset,
            "world": self.world.describe(),
            "forget_langs": list(self.forget_langs),
            "retain_langs": list(self.retain_langs),
            "eval_langs": list(self.eval_langs),
            "target": str(self.built.target),
            "retain": str(self.built.retain),
            "base": str(self.built.base),
            "forget_items": len(self.forget),
            "retain_items": len(self.retain),
            "max_new_tokens": next(iter(self.by_lang.values())).max_new_tokens,
            "precision": self.precision,
        }


def build(
    preset: str, world: World, seed: int, cache_dir: Path | None, device: str, options: Mapping[str, Any] | None = None
):
    """Base, target (every language's retain + forget rows) and retain (every language's retain rows); ``options``:
    :func:`mmunlearn.presets.parallel.build_models_parallel`'s (``overrides``, ``parallel``, ...)."""
    return build_models_parallel(
        preset,
        world.training_data,
        world.forget_split,
        None,
        seed,
        cache_dir,
        device,
        **{"parallel": False, **dict(options or {})},
    )


def _reference_logs(
    built: Any, data: Any, forget_split: str, max_new_tokens: int, device: str, precision: str, batches: dict
) -> tuple[Path, Path]:
    """The retain and target models' cached evaluations of one language (the target's forget quality needs the
    retain model's logs)."""
    common = dict(metrics=EVAL_GROUPS, precision=precision, **batches)
    retain_logs = cached_eval(built.retain, data, forget_split, None, max_new_tokens, device, **common)
    target_logs = cached_eval(built.target, data, forget_split, None, max_new_tokens, device, retain_logs, **common)
    return retain_logs, target_logs


def _evaluate_in_child(
    built: Any, datas: list, forget_split: str, max_new_tokens: int, device: str, precision: str, batches: dict
) -> None:
    """A spawned process's share of the reference evaluations (one torch thread); they land in the models' eval
    cache, where :func:`prepare` then finds them."""
    import torch

    torch.set_num_threads(1)
    for data in datas:
        _reference_logs(built, data, forget_split, max_new_tokens, device, precision, batches)


def _split_languages(world: World, langs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Two groups of ``langs`` of about equal evaluation cost (the UTF-8 size of each language's scored text, a
    stand-in for its tokens): the largest languages go one by one to the lighter group."""

    def size(lang: str) -> int:
        data = world.eval_data[lang]
        return sum(len(json.dumps(it.to_dict(), ensure_ascii=False).encode()) for rows in data.values() for it in rows)

    sizes = {lang: size(lang) for lang in langs}
    groups: tuple[list[str], list[str]] = ([], [])
    loads = [0, 0]
    for lang in sorted(langs, key=sizes.__getitem__, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(lang)
        loads[i] += sizes[lang]
    return groups


def prepare(
    preset: str,
    world: World,
    forget_langs: tuple[str, ...],
    eval_langs: tuple[str, ...],
    retain_langs: tuple[str, ...],
    seed: int,
    cache_dir: Path | None,
    device: str,
    max_new_tokens: int,
    build_options: Mapping[str, Any] | None = None,
    score_batch: int = 16,
    gen_batch: int | None = None,
) -> CrossLingualSetup:
    """Build (or reuse) the models and evaluate target and retain model in every evaluation language (each a TOFU
    setup on that language's data), at the preset's scoring precision on this host
    (:func:`recipes.tofu.settings.default_precision`: bf16 for SmolLM2 where bf16 is native, as ``tofu``'s); with
    parallel builds (``build_options['parallel']``) the languages' evaluations are split between this process and a
    spawned one. ``build_options``: :func:`build`'s; ``score_batch`` / ``gen_batch``: the evaluation's batches."""
    for what, langs in (("forget", forget_langs), ("eval", eval_langs), ("retain", retain_langs)):
        missing = [lang for lang in langs if lang not in world.languages]
        if missing or not langs:
            raise ValueError(
                f"{what} languages {missing or list(langs)} are not in the world's languages "
                f"{', '.join(world.languages)}"
            )
    built = build(preset, world, seed, cache_dir, device, build_options)
    precision = default_precision(preset, device)
    batches = dict(batch_size=score_batch, generation_batch_size=gen_batch)
    forget, retain = world.items("forget", forget_langs), world.items("retain", retain_langs)
    todo = (world.forget_split, max_new_tokens, device, precision, batches)
    if (build_options or {}).get("parallel") and len(eval_langs) > 1:
        here, there = _split_languages(world, eval_langs)
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter, as the parallel builds'
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            child = pool.submit(_evaluate_in_child, built, [world.eval_data[lang] for lang in there], *todo)
            for lang in here:
                _reference_logs(built, world.eval_data[lang], *todo)
            child.result()  # its error, if any, raised here
    by_lang = {}
    for lang in eval_langs:
        data = world.eval_data[lang]
        retain_logs, target_logs = _reference_logs(built, data, *todo)  # cached: found, not recomputed
        by_lang[lang] = TofuSetup(
            preset,
            data,
            world.forget_split,
            None,
            max_new_tokens,
            built,
            retain_logs,
            target_logs,
            Path(cache_dir) if cache_dir else default_cache_dir(),
            forget,
            retain,
            EVAL_GROUPS,
            precision=precision,
            score_batch=score_batch,
            gen_batch=gen_batch,
            device=device,
        )
    return CrossLingualSetup(preset, world, forget_langs, retain_langs, by_lang, forget, retain)


def make_row(method: str, lang: str, summary: dict[str, float], target: dict[str, float]) -> dict:
    """One (method, language) row: the COLUMNS metrics, plus the forget ROUGE-L and prob drops against
    the target model (absolute and relative to the target's value) and ``prob_ratio``, the forget-set probability
    after / before (this model's over the target's: Multilingual Amnesia's measure; 1 - ``prob_rel_drop``)."""
    row: dict[str, Any] = {"method": method, "lang": lang}
    row.update({key: summary.get(key) for _, key in COLUMNS if key in summary})
    for name, key in (("rouge", "forget_Q_A_ROUGE"), ("prob", "forget_Q_A_Prob")):
        before, after = target.get(key), summary.get(key)
        drop = None if before is None or after is None else before - after
        row[f"{name}_drop"] = drop
        row[f"{name}_rel_drop"] = drop / before if drop is not None and before > 0 else None
    before, after = target.get("forget_Q_A_Prob"), summary.get("forget_Q_A_Prob")
    row["prob_ratio"] = after / before if before is not None and after is not None and before > 0 else None
    return row


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def transfer_summary(rows: list[dict], forget_langs: tuple[str, ...]) -> list[dict]:
    """Per method: relative forget ROUGE-L (and prob) drop in the forget language(s) and in the others,
    their ratio (the share of the forgetting that carries over), and a verdict from it: ``transfers``
    (ratio >= 0.5), ``partial`` (>= 0.2), ``does not transfer``, ``no forgetting`` when the forget
    language's relative ROUGE-L drop is below MIN_DROP, ``n/a`` when a side was not evaluated."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows if not r["method"].endswith(" model")):
        mine = [r for r in rows if r["method"] == method]
        own = [r for r in mine if r["lang"] in forget_langs]
        other = [r for r in mine if r["lang"] not in forget_langs]
        entry: dict[str, Any] = {"method": method}
        for name in ("rouge", "prob"):
            f, o = _mean([r[f"{name}_rel_drop"] for r in own]), _mean([r[f"{name}_rel_drop"] for r in other])
            entry[f"{name}_drop_forget_lang"], entry[f"{name}_drop_other_langs"] = f, o
            entry[f"{name}_transfer"] = o / f if f is not None and o is not None and f > 0 else None
        entry["fq_forget_lang"] = _mean([r.get("forget_quality") for r in own])
        entry["fq_other_langs"] = _mean([r.get("forget_quality") for r in other])
        entry["mu_mean"] = _mean([r.get("model_utility") for r in mine])
        ratio, drop = entry["rouge_transfer"], entry["rouge_drop_forget_lang"]
        if drop is None or entry["rouge_drop_other_langs"] is None:
            entry["verdict"] = "n/a"
        elif drop < MIN_DROP:
            entry["verdict"] = "no forgetting"
        else:
            entry["verdict"] = "transfers" if ratio >= 0.5 else "partial" if ratio >= 0.2 else "does not transfer"
        out.append(entry)
    return out


def audit_method(method: str, ctx: CrossLingualSetup, out: Path, options, device: str, cache: dict) -> dict:
    """Robustness audit (:func:`recipes.tofu.pipeline.audit_method`) of ``out/model`` against the world's target and
    retain models: the attacks on the forget languages' scored forget rows, and the plain measures in every other
    evaluation language (``language_<lang>``); no probe (the translations ship no holdout split)."""
    scored = f"{ctx.world.forget_split}_perturbed"
    forget = [it for lang in ctx.forget_langs for it in ctx.world.eval_data[lang][scored]]
    languages = {
        lang: list(ctx.world.eval_data[lang][scored]) for lang in ctx.eval_langs if lang not in ctx.forget_langs
    }
    return tofu_audit(method, ctx, out, options, device, cache, rows=(forget, None, languages))
