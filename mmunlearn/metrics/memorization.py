"""Verbatim-memorisation scores from per-token matches: exact memorisation and extraction strength.

Input per item: a boolean vector over the T answer positions, ``matches[t] = (argmax_v p(v |
question, answer[:t]) == answer[t])`` -- the teacher-forced greedy prediction at each answer
token (``token_matches`` builds it from predicted and target ids). This is what open-unlearning's
TOFU evaluator uses (``exact_memorization`` / ``extraction_strength`` in
``src/evals/metrics/memorization.py``: argmax of the teacher-forced log-probs vs the labels).

* Exact memorisation (Tirumala et al., 2022): the fraction of answer tokens predicted right,
  ``mean_t matches[t]``.
* Extraction strength (after Carlini et al., 2021; Wang et al., ICLR 2025, "Towards Effective
  Evaluations and Comparisons for LLM Unlearning Methods"):
  ``1 - k / T`` with k the smallest start position whose whole suffix ``matches[k:]`` is right,
  i.e. the smallest fraction of the answer that must be given for the rest to be reproduced.
  As in the reference, k is searched over 0..T-1 and, when no suffix matches (the last token is
  wrong), left at T-1: such an item scores 1/T, not 0. Kept so values match the reference logs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import mmunlearn.metrics._checks as _checks


def token_matches(pred_ids: Any, target_ids: Any) -> np.ndarray:
    """Boolean ``(T,)`` vector ``pred_ids == target_ids`` for one item (ids as ints, same length)."""
    pred = _checks.to_numpy(pred_ids)
    target = _checks.to_numpy(target_ids)
    if pred.ndim != 1 or target.ndim != 1:
        raise ValueError(f"pred_ids, target_ids: expected 1-D, got shapes {pred.shape}, {target.shape}")
    if len(pred) == 0 or len(pred) != len(target):
        raise ValueError(f"pred_ids, target_ids: need equal non-zero lengths, got {len(pred)}, {len(target)}")
    return pred == target


def exact_memorization(matches: Any) -> np.ndarray:
    """Per-item exact memorisation, shape ``(N,)``: the fraction of answer tokens predicted right.

    matches: per item a ``(T_i,)`` boolean (or 0/1) vector, as a list or a ``(N, T)`` array.
    """
    return np.array([float(m.mean()) for m in _checks.bool_rows(matches, "matches")])


def extraction_strength(matches: Any) -> np.ndarray:
    """Per-item extraction strength, shape ``(N,)``, in [1/T_i, 1] (see the module docstring).

    matches: per item a ``(T_i,)`` boolean (or 0/1) vector, as a list or a ``(N, T)`` array.
    """
    out = []
    for m in _checks.bool_rows(matches, "matches"):
        t = len(m)
        # Suffix m[k:] is all True iff k >= (index of the last False) + 1.
        wrong = np.flatnonzero(~m)
        k = 0 if len(wrong) == 0 else min(int(wrong[-1]) + 1, t - 1)
        out.append(1.0 - k / t)
    return np.array(out)
