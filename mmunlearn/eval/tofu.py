"""TOFU evaluation harness: score a model adapter on the TOFU splits and write open-unlearning-style logs.

``evaluate_tofu(adapter, data, forget_split="forget10", ...)`` computes what open-unlearning's TOFU
evaluator computes (``configs/eval/tofu.yaml``, ``src/evals/metrics/``) with the pure functions of
:mod:`mmunlearn.metrics`, returns the ``{key: entry}`` logs and, with ``out_dir``, writes
``TOFU_EVAL.json``, ``TOFU_SUMMARY.json`` and ``TOFU_SUMMARY.md``.

Settings taken from the reference: greedy decoding, ``max_new_tokens=200``
(``configs/generation/default.yaml`` on open-unlearning main; an earlier revision used 64), ROUGE-L
recall of the stripped generation against ``answer``; min-k and min-k++ with k = 0.4; MIA members
= ``forgetPP_perturbed``'s answers, non-members = ``holdoutPP`` (``holdout_split``).

Forget quality and privleak compare with a *retain model* (never trained on the forget set): pass
its ``TOFU_EVAL.json`` (or the directory holding it) as ``retain_logs``. Without it both keys are
written with ``agg_value: None`` (as the reference does for forget quality; the reference would fall
back to a retain AUC of 0.5 for privleak, which makes the number look meaningful when it is not, so
it is left None here). A retain log without the entry one of them needs (``forget_truth_ratio``,
``mia_min_k``) leaves that one None with a warning naming the file, as the reference does; the other
is still computed. Evaluate the retain model first, without ``retain_logs``, then every other model
against its logs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mmunlearn.eval.scoring import Scores, generate_answers, score_answers, score_candidates
from mmunlearn.eval.splits import EvalSplits, load_eval_splits
from mmunlearn.eval.summary import write_summary_md
from mmunlearn.metrics import entries, memorization, mia, tofu
from mmunlearn.metrics.keys import RETAIN_LOGS_PRIVLEAK_KEY, RETAIN_LOGS_TRUTH_RATIO_KEY
from mmunlearn.metrics.logs import (
    EVAL_FILENAME,
    read_tofu_logs,
    retain_agg_value,
    retain_forget_truth_ratios,
    write_tofu_logs,
)

log = logging.getLogger(__name__)

# Metric groups selectable with ``metrics=``; each names the keys it adds.
METRIC_GROUPS: dict[str, tuple[str, ...]] = {
    "forget": (
        "forget_Q_A_Prob",
        "forget_Q_A_PARA_Prob",
        "forget_Q_A_PERT_Prob",
        "forget_Q_A_ROUGE",
        "forget_truth_ratio",
        "forget_quality",
    ),
    "memorization": ("extraction_strength", "exact_memorization"),
    "utility": (
        "retain_Q_A_Prob",
        "retain_Q_A_PARA_Prob",
        "retain_Q_A_PERT_Prob",
        "retain_Q_A_ROUGE",
        "retain_Truth_Ratio",
        "ra_Q_A_Prob",
        "ra_Q_A_PERT_Prob",
        "ra_Q_A_Prob_normalised",
        "ra_Q_A_ROUGE",
        "ra_Truth_Ratio",
        "wf_Q_A_Prob",
        "wf_Q_A_PERT_Prob",
        "wf_Q_A_Prob_normalised",
        "wf_Q_A_ROUGE",
        "wf_Truth_Ratio",
        "model_utility",
        "model_utility_rouge",
    ),
    "mia": ("mia_loss", "mia_zlib", "mia_min_k", "mia_min_k_plus_plus", "privleak"),
}
DEFAULT_MAX_NEW_TOKENS = 200  # open-unlearning configs/generation/default.yaml


def _groups(metrics: Collection[str] | None) -> tuple[str, ...]:
    if metrics is None:
        return tuple(METRIC_GROUPS)
    if isinstance(metrics, str):
        metrics = [metrics]
    unknown = [m for m in metrics if m not in METRIC_GROUPS]
    if unknown or not metrics:
        raise ValueError(f"metrics: unknown group(s) {unknown or '(none given)'}; choose from {list(METRIC_GROUPS)}")
    return tuple(g for g in METRIC_GROUPS if g in metrics)


class _RetainRef:
    """What forget quality and privleak read from the retain model's logs (read and checked up front).

    As the reference evaluator does, a retain log without the entry a metric needs is not an error:
    that metric is left None with a warning naming the file (``forget_truth_ratio`` for forget
    quality, ``mia_min_k`` with an ``agg_value`` for privleak), and the other is still computed. A
    missing or unreadable file, or an entry of the wrong shape, is still an error.
    """

    def __init__(self, path: str | os.PathLike[str] | None, groups: Sequence[str]):
        self.path = path
        self.truth_ratios: np.ndarray | None = None
        self.min_k_auc: float | None = None
        if path is None:
            return
        logs = read_tofu_logs(path)  # clear FileNotFoundError / JSON error first
        file = Path(path) / EVAL_FILENAME if Path(path).is_dir() else Path(path)
        if "forget" in groups:
            if RETAIN_LOGS_TRUTH_RATIO_KEY in logs:
                self.truth_ratios = retain_forget_truth_ratios(path)
            else:
                log.warning(
                    "%s has no %r entry: forget_quality is left None (evaluate the retain model with the "
                    "forget metrics to get it)",
                    file,
                    RETAIN_LOGS_TRUTH_RATIO_KEY,
                )
        if "mia" in groups:
            entry = logs.get(RETAIN_LOGS_PRIVLEAK_KEY)
            if isinstance(entry, Mapping) and entry.get("agg_value") is not None:
                self.min_k_auc = retain_agg_value(path, RETAIN_LOGS_PRIVLEAK_KEY)
            elif entry is None or isinstance(entry, Mapping):
                log.warning(
                    "%s has no %r AUC: privleak is left None (evaluate the retain model with the mia "
                    "metrics to get it)",
                    file,
                    RETAIN_LOGS_PRIVLEAK_KEY,
                )
            else:
                raise ValueError(
                    f"{file}: {RETAIN_LOGS_PRIVLEAK_KEY!r} is not an entry (a mapping with an "
                    f"'agg_value'), got {type(entry).__name__}"
                )


def _qa_block(
    adapter: Any,
    prefix: str,
    items: list,
    answer: Scores,
    *,
    para: bool,
    batch_size: int,
    max_new_tokens: int | str,
    gen_batch_size: int,
) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray]:
    """Prob / PARA / PERT / ROUGE entries of one split; returns (entries, para NLL or None, PERT NLL)."""
    out: dict[str, Any] = {f"{prefix}_Q_A_Prob": entries.prob_entry(answer.avg_nll)}
    para_nll = None
    if para:
        para_nll = score_answers(
            adapter,
            items,
            [it.paraphrased_answer for it in items],
            batch_size=batch_size,
            desc=f"{prefix}_Q_A_PARA_Prob",
        ).avg_nll
        out[f"{prefix}_Q_A_PARA_Prob"] = entries.prob_entry(para_nll)
    pert_nll = score_candidates(
        adapter,
        items,
        [it.perturbed_answer for it in items],
        batch_size=batch_size,
        desc=f"{prefix}_Q_A_PERT_Prob",
        what=f"{prefix} perturbed_answer",
    )
    out[f"{prefix}_Q_A_PERT_Prob"] = entries.prob_entry(pert_nll)
    questions = [it.question for it in items]
    gens = generate_answers(
        adapter,
        questions,
        max_new_tokens=max_new_tokens,
        batch_size=gen_batch_size,
        desc=f"{prefix}_Q_A_ROUGE (generate)",
        gold=[it.answer for it in items],
    )
    out[f"{prefix}_Q_A_ROUGE"] = entries.rouge_entry(gens, [it.answer.strip() for it in items], questions)
    return out, para_nll, pert_nll


def _forget_metrics(adapter: Any, splits: EvalSplits, fs: Scores, retain: _RetainRef, **kw: Any) -> dict[str, Any]:
    out, para_nll, pert_nll = _qa_block(adapter, "forget", splits.forget, fs, para=True, **kw)
    tr = entries.truth_ratio_entry(para_nll, pert_nll, "closer_to_1_better")
    out["forget_truth_ratio"] = tr
    quality = None
    if retain.truth_ratios is not None:
        if len(retain.truth_ratios) != len(fs):
            log.warning(
                "forget_quality: the retain logs hold %d forget truth ratios, this model %d "
                "(different forget split or author subset?)",
                len(retain.truth_ratios),
                len(fs),
            )
        quality = tofu.forget_quality(entries.per_item(tr, "score"), retain.truth_ratios)
    out["forget_quality"] = entries.agg_entry(quality)
    return out


def _utility_metrics(adapter: Any, splits: EvalSplits, batch_size: int, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    retain = splits.retain
    rs = score_answers(adapter, retain, batch_size=batch_size, desc="retain_Q_A_Prob")
    block, para_nll, pert_nll = _qa_block(adapter, "retain", retain, rs, para=True, batch_size=batch_size, **kw)
    out.update(block)
    out["retain_Truth_Ratio"] = entries.truth_ratio_entry(para_nll, pert_nll, "true_better")
    for prefix, items in (("ra", splits.real_authors), ("wf", splits.world_facts)):
        s = score_answers(adapter, items, batch_size=batch_size, desc=f"{prefix}_Q_A_Prob")
        block, _, pert_nll = _qa_block(adapter, prefix, items, s, para=False, batch_size=batch_size, **kw)
        out.update(block)
        out[f"{prefix}_Q_A_Prob_normalised"] = entries.normalised_prob_entry(s.avg_nll, pert_nll)
        out[f"{prefix}_Truth_Ratio"] = entries.truth_ratio_entry(s.avg_nll, pert_nll, "true_better")
    out["model_utility"] = entries.agg_entry(tofu.model_utility(out))
    out["model_utility_rouge"] = entries.agg_entry(tofu.model_utility_rouge(out))
    return out


def _mia_metrics(adapter: Any, splits: EvalSplits, fs: Scores, retain: _RetainRef, batch_size: int) -> dict[str, Any]:
    hs = score_answers(adapter, splits.holdout, batch_size=batch_size, token_stats=True, desc="MIA holdout")

    def attack(s: Scores) -> dict[str, np.ndarray]:
        return {
            "mia_loss": mia.loss_scores(s.avg_nll),
            "mia_zlib": mia.zlib_scores(s.avg_nll, s.target_text),
            "mia_min_k": mia.min_k_scores(s.token_logprobs, mia.MIN_K),
            "mia_min_k_plus_plus": mia.min_k_plus_plus_scores(s.token_logprobs, s.mu, s.sigma, mia.MIN_K),
        }

    members, nonmembers = attack(fs), attack(hs)
    out = {key: entries.mia_entry(members[key], nonmembers[key]) for key in members}
    leak = None
    if retain.min_k_auc is not None:
        try:
            leak = mia.privleak(out["mia_min_k"]["auc"], retain.min_k_auc)
        except ValueError as e:  # a retain-model AUC of exactly 1.0 leaves privleak undefined
            log.warning("privleak not computed: %s", e)
    out["privleak"] = entries.agg_entry(leak)
    return out


def _check_utility_items(utility_items: int | None) -> None:
    """Refuse a ``utility_items`` that is not a positive integer or None."""
    if utility_items is not None and (
        isinstance(utility_items, bool) or not isinstance(utility_items, int) or utility_items < 1
    ):
        raise ValueError(f"utility_items must be a positive integer or None, got {utility_items!r}")


def evaluate_tofu(
    adapter: Any,
    data: str | os.PathLike[str] | Mapping[str, Sequence[Any]],
    forget_split: str = "forget10",
    authors: int | None = None,
    retain_logs: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 16,
    max_new_tokens: int | str = DEFAULT_MAX_NEW_TOKENS,
    metrics: Collection[str] | None = None,
    generation_batch_size: int | None = None,
    model_name: str | None = None,
    utility_items: int | None = None,
) -> dict[str, Any]:
    """Evaluate ``adapter`` on TOFU; returns the logs ``{key: entry}`` in open-unlearning's layout.

    adapter: a :class:`~mmunlearn.adapters.base.TokenAdapter` with ``generate``
        (e.g. ``TextLLMAdapter``; its forward may return log-probs, see ``mmunlearn.eval.scoring``).
    data: a TOFU source for ``load_split``: a folder of split files, ``"synthetic[:...]"``, a hub id
        or a mapping split -> ``QAItem`` list.
    forget_split: ``forgetPP``; reads ``forgetPP_perturbed`` and ``holdoutPP`` (module docstring).
    authors: evaluate a world of N authors (``load_split(..., authors=N)`` for every split).
    retain_logs: the retain model's ``TOFU_EVAL.json`` or its directory, for forget_quality and
        privleak (None: both written with ``agg_value: None``).
    out_dir: write ``TOFU_EVAL.json``, ``TOFU_SUMMARY.json`` and ``TOFU_SUMMARY.md`` there.
    batch_size: teacher-forced scoring batch; generation_batch_size: generation batch (default the same).
    max_new_tokens: greedy generation length for the ROUGE metrics, or ``"auto"`` (lean: per batch, its
        longest gold answer plus a margin, :func:`mmunlearn.eval.scoring.generate_answers`).
    utility_items: keep the first N real-authors and N world-facts items (None: all, the reference);
        recorded in the summary settings. These splits do not shrink with ``authors``.
    metrics: metric groups to compute, a subset of ``METRIC_GROUPS`` (forget, memorization, utility,
        mia; default all).
    model_name: shown in the Markdown summary (default: the out_dir's name).
    """
    groups = _groups(metrics)
    check_max_new_tokens(max_new_tokens)
    _check_utility_items(utility_items)
    gen_batch_size = generation_batch_size or batch_size
    splits = load_eval_splits(data, forget_split, authors, groups)  # all data errors before any model work
    if utility_items is not None and splits.real_authors is not None:
        splits = replace(
            splits, real_authors=splits.real_authors[:utility_items], world_facts=splits.world_facts[:utility_items]
        )
    retain = _RetainRef(retain_logs, groups)
    t0 = time.perf_counter()
    kw = dict(batch_size=batch_size, max_new_tokens=max_new_tokens, gen_batch_size=gen_batch_size)
    with adapter.bf16_generation():  # a no-op unless the adapter has a faster generation copy
        logs = _evaluate(adapter, splits, groups, retain, kw, batch_size)
    elapsed = time.perf_counter() - t0
    log.info("TOFU evaluation took %.1f s", elapsed)
    if out_dir is not None:
        write_tofu_logs(out_dir, logs)
        settings = {
            "data": _source_name(data),
            "forget split": forget_split,
            "holdout split": splits.holdout_split,
            "authors": "all" if authors is None else authors,
            "items": splits.sizes(),
            "max new tokens (greedy)": max_new_tokens,
            "utility items": "all" if utility_items is None else utility_items,
            "precision": adapter.precision,
            "retain logs": str(retain_logs or "none"),
            "time (s)": round(elapsed, 1),
        }
        write_summary_md(Path(out_dir), logs, model_name or Path(out_dir).name, settings)
    return logs


def check_max_new_tokens(value: Any) -> int | str:
    """``value`` if it is a positive integer or ``"auto"`` (a ``ValueError`` otherwise)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"max_new_tokens must be a positive integer or 'auto', got {value!r}")


def _evaluate(
    adapter: Any, splits: EvalSplits, groups: tuple[str, ...], retain: _RetainRef, kw: dict, batch_size: int
) -> dict[str, Any]:
    logs: dict[str, Any] = {}
    fs = None
    if splits.forget is not None:
        fs = score_answers(
            adapter,
            splits.forget,
            batch_size=batch_size,
            token_stats=bool({"memorization", "mia"} & set(groups)),
            desc="forget_Q_A_Prob",
        )
    if "forget" in groups:
        logs.update(_forget_metrics(adapter, splits, fs, retain, **kw))
    if "memorization" in groups:
        logs["extraction_strength"] = entries.score_entry(memorization.extraction_strength(fs.matches))
        logs["exact_memorization"] = entries.score_entry(memorization.exact_memorization(fs.matches))
    if "utility" in groups:
        logs.update(_utility_metrics(adapter, splits, **kw))
    if "mia" in groups:
        logs.update(_mia_metrics(adapter, splits, fs, retain, batch_size))
    return logs


def _source_name(data: Any) -> str:
    return "mapping" if isinstance(data, Mapping) else str(os.fspath(data))
