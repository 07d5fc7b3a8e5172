"""Log entries in open-unlearning's TOFU layout: one ``{"agg_value", "value_by_index"}`` dict per key.

Each builder takes per-item scores, computes the metric with the pure functions of this package
and returns the JSON-ready entry the reference evaluator writes for that kind of key:

==========================  ===================================================================
builder                     keys (``value_by_index[i]`` fields)
==========================  ===================================================================
``prob_entry``              ``*_Q_A_Prob``, ``*_PARA_Prob``, ``*_PERT_Prob`` (prob, avg_loss;
                            lists for several candidates)
``truth_ratio_entry``       ``forget_truth_ratio``, ``*_Truth_Ratio`` (score = R)
``normalised_prob_entry``   ``ra_/wf_Q_A_Prob_normalised`` (prob)
``rouge_entry``             ``*_ROUGE`` (rouge1_recall, rougeL_f1, rougeL_recall, input,
                            ground_truth, generation)
``score_entry``             ``exact_memorization``, ``extraction_strength`` (score)
``mia_entry``               ``mia_*``: ``{"forget": {...}, "holdout": {...}, "auc", "agg_value"}``
``agg_entry``               ``forget_quality``, ``model_utility``, ``privleak`` (agg_value only,
                            as in the reference)
==========================  ===================================================================

``indices`` (optional everywhere) are the items' dataset indices; default ``0..N-1``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import mmunlearn.metrics._checks as _checks
import mmunlearn.metrics.mia as mia
import mmunlearn.metrics.rouge as rouge
import mmunlearn.metrics.tofu as tofu

Entry = dict[str, Any]


def _floats(x: np.ndarray) -> Any:
    """Plain Python float(s) for JSON: a float, or a list for a 1-D row."""
    return [float(v) for v in x] if np.ndim(x) else float(x)


def agg_entry(value: float | None) -> Entry:
    """An aggregate-only entry ``{"agg_value": value}`` (None allowed, as the reference writes)."""
    if value is not None:
        value = float(value)
        if np.isnan(value):
            raise ValueError("agg_value: NaN")
    return {"agg_value": value}


def score_entry(scores: Any, indices: Sequence[int] | None = None) -> Entry:
    """Per-item ``{"score": s}`` and their mean (exact_memorization, extraction_strength, ...).

    scores: ``(N,)`` per-item values.
    """
    s = _checks.vector(scores, "scores")
    keys = _checks.index_keys(indices, len(s))
    return {
        "agg_value": float(s.mean()),
        "value_by_index": {k: {"score": float(v)} for k, v in zip(keys, s)},
    }


def prob_entry(avg_nll: Any, indices: Sequence[int] | None = None) -> Entry:
    """A ``*_Prob`` entry from average answer NLLs ``(N,)`` or ``(N, K)`` (K candidates per item)."""
    nll = _checks.nll(avg_nll, "avg_nll", (1, 2))
    probs = tofu.prob_from_nll(nll)
    keys = _checks.index_keys(indices, len(nll))
    return {
        "agg_value": tofu.qa_prob(nll),
        "value_by_index": {k: {"prob": _floats(p), "avg_loss": _floats(loss)} for k, p, loss in zip(keys, probs, nll)},
    }


def truth_ratio_entry(
    nll_correct: Any,
    nll_wrong: Any,
    aggregator: str,
    indices: Sequence[int] | None = None,
) -> Entry:
    """A truth-ratio entry: per-item ``{"score": R}`` and the named aggregate.

    nll_correct: ``(N,)`` average NLL of the correct answer (paraphrased answer for forget and
        retain, ``answer`` for real authors / world facts). nll_wrong: ``(N, K)`` perturbed answers.
    aggregator: ``"closer_to_1_better"`` (forget set) or ``"true_better"`` (the others).
    """
    if aggregator not in tofu.TRUTH_RATIO_AGGREGATORS:
        raise ValueError(f"aggregator: {aggregator!r} is not one of {sorted(tofu.TRUTH_RATIO_AGGREGATORS)}")
    ratios = tofu.truth_ratio(nll_correct, nll_wrong)
    keys = _checks.index_keys(indices, len(ratios))
    return {
        "agg_value": tofu.TRUTH_RATIO_AGGREGATORS[aggregator](ratios),
        "value_by_index": {k: {"score": float(r)} for k, r in zip(keys, ratios)},
    }


def normalised_prob_entry(nll_correct: Any, nll_wrong: Any, indices: Sequence[int] | None = None) -> Entry:
    """A ``*_Q_A_Prob_normalised`` entry: ``(N,)`` answer NLLs vs ``(N, K)`` wrong-option NLLs."""
    probs = tofu.normalised_prob(nll_correct, nll_wrong)
    keys = _checks.index_keys(indices, len(probs))
    return {
        "agg_value": float(probs.mean()),
        "value_by_index": {k: {"prob": float(p)} for k, p in zip(keys, probs)},
    }


def rouge_entry(
    generations: Sequence[str],
    references: Sequence[str],
    questions: Sequence[str] | None = None,
    rouge_type: str = "rougeL_recall",
    indices: Sequence[int] | None = None,
) -> Entry:
    """A ``*_ROUGE`` entry: per-item ROUGE numbers and texts, aggregate = mean of ``rouge_type``.

    generations / references / questions: N strings each (questions are logged as ``input``).
    """
    if rouge_type not in rouge.ROUGE_FIELDS:
        raise ValueError(f"rouge_type: {rouge_type!r} is not one of {list(rouge.ROUGE_FIELDS)}")
    scores = rouge.rouge_scores(generations, references)
    gens, refs = list(generations), list(references)
    if questions is None:
        inputs = [""] * len(gens)
    else:
        inputs = _checks.strings(questions, "questions")
        _checks.same_length(generations=gens, questions=inputs)
    keys = _checks.index_keys(indices, len(gens))
    value_by_index = {}
    for i, k in enumerate(keys):
        item: dict[str, Any] = {f: float(scores[f][i]) for f in rouge.ROUGE_FIELDS}
        item.update(input=inputs[i], ground_truth=refs[i], generation=gens[i])
        value_by_index[k] = item
    return {"agg_value": float(scores[rouge_type].mean()), "value_by_index": value_by_index}


def mia_entry(
    member_scores: Any,
    nonmember_scores: Any,
    member_indices: Sequence[int] | None = None,
    nonmember_indices: Sequence[int] | None = None,
) -> Entry:
    """A ``mia_*`` entry: both sets' per-item scores, their means, and the AUC (= ``agg_value``).

    member_scores: ``(N,)`` loss-like attack scores on the forget set; nonmember_scores: ``(M,)``
    on the holdout set (see ``mmunlearn.metrics.mia`` for the attacks and the sign convention).
    """
    auc = mia.mia_auc(member_scores, nonmember_scores)
    return {
        "forget": score_entry(member_scores, member_indices),
        "holdout": score_entry(nonmember_scores, nonmember_indices),
        "auc": auc,
        "agg_value": auc,
    }


def _index_order(key: Any) -> tuple[int, int, str]:
    """Numeric keys first, in numeric order ("2" before "10"); any others after, by text."""
    s = str(key)
    return (0, int(s), s) if s.isdigit() else (1, 0, s)


def per_item(entry: Mapping[str, Any], field: str = "score") -> np.ndarray:
    """An entry's per-item ``field`` values in index order (indices sorted numerically), ``(N,)``.

    E.g. ``per_item(logs["forget_truth_ratio"])`` gives the truth ratios forget quality needs.
    """
    by_index = entry.get("value_by_index") if isinstance(entry, Mapping) else None
    if not isinstance(by_index, Mapping) or not by_index:
        raise ValueError("entry: no (or empty) 'value_by_index'")
    out = []
    for key in sorted(by_index, key=_index_order):
        item = by_index[key]
        if not isinstance(item, Mapping) or field not in item:
            raise ValueError(f"entry: value_by_index[{key!r}] has no {field!r}")
        if item[field] is None:
            raise ValueError(f"entry: value_by_index[{key!r}][{field!r}] is None")
        out.append(item[field])
    return _checks.float_array(out, f"value_by_index[*][{field!r}]", (1, 2))
