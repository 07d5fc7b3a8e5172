"""TOFU scores from per-item answer NLLs: prob, truth ratio, normalised prob, forget quality, utility.

Definitions follow TOFU (Maini et al., 2024, arXiv:2401.06121) as computed by the open-unlearning
TOFU evaluator (locuslab/open-unlearning, ``src/evals/metrics/memorization.py``, ``privacy.py``,
``utility.py`` and ``configs/eval/tofu_metrics/*.yaml``), so that values match its logs:

* An item's *average NLL* is the mean over answer tokens of -log p(token | prefix) (teacher
  forced); its *prob* is ``exp(-avg_nll)``. With several candidates per item (the perturbed
  answers, shape ``(N, K)``) the reference logs each candidate's prob and averages the *probs*
  for the aggregate (``*_Q_A_PERT_Prob``), while the truth ratio averages the candidates' *NLLs*.
* Truth ratio per item: ``R = exp(-mean_k nll_wrong_k) / (exp(-nll_correct) + 1e-10)``. Which
  answer is "correct" (from the reference's ``pre_compute`` configs):

  - forget set (``forget_truth_ratio``): correct = ``paraphrased_answer`` (forget_Q_A_PARA_Prob),
    wrong = ``perturbed_answer`` (forget_Q_A_PERT_Prob); aggregate ``closer_to_1_better`` =
    ``mean(min(R, 1 / (R + 1e-10)))``.
  - retain set (``retain_Truth_Ratio``): correct = ``paraphrased_answer`` of ``retain_perturbed``
    (retain_Q_A_PARA_Prob), wrong = ``perturbed_answer``; aggregate ``true_better`` =
    ``mean(max(0, 1 - R))``.
  - real authors / world facts (``ra_Truth_Ratio`` / ``wf_Truth_Ratio``): correct = ``answer``
    (ra_Q_A_Prob / wf_Q_A_Prob; these sets have no paraphrase), wrong = ``perturbed_answer``;
    aggregate ``true_better``.
* Two definitions of the truth ratio are in use. The one above (wrong over correct, which TOFU's code and
  open-unlearning's evaluator compute, and the one every ``*truth_ratio`` value in our logs and tables is) and the
  one the OpenUnlearning report writes (Dorna et al., 2025, arXiv:2506.12618, p. 18; open-unlearning issue #138):
  ``p(para) / (p(para) + p(pert)) = 1 / (1 + R)`` (:func:`truth_ratio_share`), a share in (0, 1) where 0.5 means
  the two answers are equally likely. Their aggregates differ, but forget quality does not: ``1 / (1 + R)`` is a
  strictly decreasing function of R, and the two-sample KS statistic depends only on the order of the pooled
  values, so the p-value is the same under either (tests/metrics/test_truth_ratio_variants.py).
* Forget quality: ``scipy.stats.ks_2samp(R_unlearned, R_retain).pvalue`` where both samples are
  the *raw* per-item forget-set truth ratios R (the ``score`` entries of ``forget_truth_ratio``'s
  ``value_by_index``, the retain model's read from its ``TOFU_EVAL.json``), not min(R, 1/R).
* Normalised prob (``ra_/wf_Q_A_Prob_normalised``): ``p(answer) / (p(answer) + sum_k
  p(wrong_k) + 1e-10)`` with each p the length-normalised prob above.
* Model utility: ``scipy.stats.hmean`` of the nine aggregates in ``MODEL_UTILITY_KEYS``.

The 1e-10 guards are the reference's; they are kept so per-item values agree with its logs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

import mmunlearn.metrics._checks as _checks
from mmunlearn.metrics.keys import MODEL_UTILITY_KEYS, MODEL_UTILITY_ROUGE_KEYS

_EPS = 1e-10  # the reference's guard in every ratio below


def prob_from_nll(avg_nll: Any) -> np.ndarray:
    """Length-normalised probability ``exp(-avg_nll)``, same shape as the input.

    avg_nll: ``(N,)`` average answer-token NLL per item, or ``(N, K)`` for K candidates per item.
    """
    return np.exp(-_checks.nll(avg_nll, "avg_nll", (1, 2)))


def qa_prob(avg_nll: Any) -> float:
    """Aggregate prob (``*_Q_A_Prob``, ``*_Q_A_PARA_Prob``, ``*_Q_A_PERT_Prob``).

    avg_nll: ``(N,)`` or ``(N, K)``. Mean over items of the per-item prob, a 2-D input's probs
    first averaged over the K candidates (the reference's ``aggregate_to_1D``).
    """
    p = prob_from_nll(avg_nll)
    return float(np.mean(p.mean(axis=1) if p.ndim == 2 else p))


def _item_nll(x: Any, name: str) -> np.ndarray:
    """``(N,)`` NLL per item; a ``(N, K)`` input is averaged over its K candidates."""
    arr = _checks.nll(x, name, (1, 2))
    return arr.mean(axis=1) if arr.ndim == 2 else arr


def truth_ratio(nll_correct: Any, nll_wrong: Any) -> np.ndarray:
    """Per-item truth ratio ``R = exp(-nll_wrong) / (exp(-nll_correct) + 1e-10)``, shape ``(N,)``.

    nll_correct: ``(N,)`` average NLL of the "correct" answer (see the module docstring for which
        one per set), or ``(N, K)`` (candidates' NLLs averaged).
    nll_wrong: ``(N, K)`` average NLL of each of K perturbed answers (averaged over K before
        ``exp``), or ``(N,)`` for one wrong answer per item.
    """
    correct = _item_nll(nll_correct, "nll_correct")
    wrong = _item_nll(nll_wrong, "nll_wrong")
    _checks.same_length(nll_correct=correct, nll_wrong=wrong)
    return np.exp(-wrong) / (np.exp(-correct) + _EPS)


def truth_ratio_share(nll_correct: Any, nll_wrong: Any) -> np.ndarray:
    """Per-item truth ratio as the OpenUnlearning report defines it (arXiv:2506.12618, p. 18), shape ``(N,)``:
    ``p_correct / (p_correct + p_wrong)`` with the probabilities of :func:`truth_ratio` (``1 / (1 + R)`` up to its
    1e-10 guard). Not what the logs hold (:func:`truth_ratio`); forget quality is the same under both."""
    correct = np.exp(-_item_nll(nll_correct, "nll_correct"))
    wrong = np.exp(-_item_nll(nll_wrong, "nll_wrong"))
    _checks.same_length(nll_correct=correct, nll_wrong=wrong)
    return correct / (correct + wrong)


def truth_ratio_closer_to_1(ratios: Any) -> float:
    """Forget-set aggregate: ``mean(min(R, 1/(R + 1e-10)))``; 1 when wrong and correct are equally likely."""
    r = _checks.vector(ratios, "ratios")
    if (r < 0).any():
        raise ValueError(f"ratios: truth ratios are >= 0, got {float(r.min()):.4g}")
    return float(np.mean(np.minimum(r, 1.0 / (r + _EPS))))


def truth_ratio_true_better(ratios: Any) -> float:
    """Retain / real-authors / world-facts aggregate: ``mean(max(0, 1 - R))``; 1 when the truth wins."""
    r = _checks.vector(ratios, "ratios")
    if (r < 0).any():
        raise ValueError(f"ratios: truth ratios are >= 0, got {float(r.min()):.4g}")
    return float(np.mean(np.maximum(0.0, 1.0 - r)))


# The reference's aggregator names (``aggregator:`` in its truth-ratio configs).
TRUTH_RATIO_AGGREGATORS: dict[str, Callable[[Any], float]] = {
    "closer_to_1_better": truth_ratio_closer_to_1,
    "true_better": truth_ratio_true_better,
}


def normalised_prob(nll_correct: Any, nll_wrong: Any) -> np.ndarray:
    """Per-item prob of the answer normalised over the options, shape ``(N,)``.

    ``p_c / (p_c + sum_k p_k + 1e-10)`` with ``p = exp(-avg_nll)``.
    nll_correct: ``(N,)`` average NLL of ``answer``.
    nll_wrong: ``(N, K)`` average NLL of each of the K wrong options (``perturbed_answer``).
    """
    p_correct = np.exp(-_checks.nll(nll_correct, "nll_correct", (1,)))
    p_wrong = np.exp(-_checks.nll(nll_wrong, "nll_wrong", (1, 2)))
    _checks.same_length(nll_correct=p_correct, nll_wrong=p_wrong)
    wrong_sum = p_wrong.sum(axis=1) if p_wrong.ndim == 2 else p_wrong
    return p_correct / (p_correct + wrong_sum + _EPS)


def forget_quality(tr_unlearned: Any, tr_retain: Any) -> float:
    """KS-test p-value between two models' per-item forget-set truth ratios (higher = closer).

    tr_unlearned: ``(N,)`` raw truth ratios R of the evaluated model on the forget set.
    tr_retain: ``(M,)`` the same for the retain model (never trained on the forget set), e.g. from
        ``mmunlearn.metrics.logs.retain_forget_truth_ratios``. N and M may differ.
    """
    a = _checks.vector(tr_unlearned, "tr_unlearned")
    b = _checks.vector(tr_retain, "tr_retain")
    return float(stats.ks_2samp(a, b).pvalue)


def harmonic_mean(values: Any) -> float:
    """Harmonic mean of non-negative finite numbers; 0.0 when any value is 0.

    Zero is handled before ``scipy.stats.hmean`` (which would warn on 1/0): the harmonic mean's
    limit as any value goes to 0 is 0. Negative, infinite or NaN values raise ValueError.
    """
    v = _checks.vector(values, "values")
    if not np.isfinite(v).all():
        raise ValueError(f"values: harmonic mean needs finite values, got {v.tolist()}")
    if (v < 0).any():
        raise ValueError(f"values: harmonic mean needs non-negative values, got {v.tolist()}")
    if (v == 0).any():
        return 0.0
    return float(stats.hmean(v))


def _pick(components: Mapping[str, Any], keys: Sequence[str]) -> list[float]:
    missing = [k for k in keys if k not in components]
    if missing:
        raise ValueError(f"components: missing {missing} (need {list(keys)})")
    out = []
    for k in keys:
        value = components[k]
        if isinstance(value, Mapping):  # a log entry: take its aggregate
            value = value.get("agg_value")
        if value is None:
            raise ValueError(f"components[{k!r}]: no value")
        out.append(float(value))
    return out


def model_utility(components: Mapping[str, Any]) -> float:
    """TOFU model utility: harmonic mean of the nine aggregates named in ``MODEL_UTILITY_KEYS``.

    components: key -> aggregate value (a float, or a log entry with ``agg_value``); extra keys
        are ignored, so a whole summary or ``TOFU_EVAL`` mapping can be passed.
    """
    return harmonic_mean(_pick(components, MODEL_UTILITY_KEYS))


def model_utility_rouge(components: Mapping[str, Any]) -> float:
    """MU-ROUGE: harmonic mean of the three ROUGE-L recalls in ``MODEL_UTILITY_ROUGE_KEYS``."""
    return harmonic_mean(_pick(components, MODEL_UTILITY_ROUGE_KEYS))
