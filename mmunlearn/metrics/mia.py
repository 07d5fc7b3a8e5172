"""Membership-inference attack scores, their AUC (forget = members vs holdout = non-members), privleak.

Conventions of open-unlearning's TOFU evaluator (``src/evals/metrics/mia/``, ``privacy.py``):

* Every attack score is signed like a loss: **higher score = less likely a member**.
  - loss: the item's average answer-token NLL (Yeom et al., 2018).
  - zlib: ``avg_nll / len(zlib.compress(text.encode("utf-8")))`` with the answer text (Carlini et
    al., 2021, "Extracting Training Data from Large Language Models").
  - min-k: ``-mean`` of the ``max(1, int(k * T))`` lowest token log-probs (Shi et al., 2024,
    arXiv:2310.16789); TOFU uses k = 0.4.
  - min-k++: the same on z-scored token log-probs ``(log p(x_t) - mu_t) / sigma_t`` where mu_t and
    sigma_t**2 are the mean and variance of log p(.) under the model's own next-token distribution
    at position t (Zhang et al., 2024, arXiv:2404.02936). The variance is floored at 1e-6 as in the
    reference, i.e. sigma at 1e-3.
* AUC = P(score(non-member) > score(member)) + 0.5 P(tie) -- the reference's
  ``roc_auc_score(labels=[0]*forget + [1]*holdout, scores)``. 1.0: members perfectly
  distinguishable by their lower scores; 0.5: indistinguishable; 0.0: members score higher.
* privleak = ``((1 - AUC_unlearned) - (1 - AUC_retain)) / (1 - AUC_retain + 1e-10) * 100`` on the
  min-k AUCs. The reference converts its AUCs to MUSE's orientation (1 - AUC) before the relative
  difference, so a model that still memorises the forget set (AUC -> 1) gets privleak -> -100
  against a retain model at 0.5; 0 means "like the retain model".
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats

import mmunlearn.metrics._checks as _checks

MIN_K = 0.4  # k of min-k and min-k++ in the TOFU configs (mia_min_k.yaml, mia_min_k_plus_plus.yaml)
_VAR_FLOOR = 1e-6  # the reference's floor on the vocabulary log-prob variance
_SIGMA_FLOOR = _VAR_FLOOR**0.5
_EPS = 1e-10  # the reference's guard in privleak's denominator


def mia_auc(member_scores: Any, nonmember_scores: Any) -> float:
    """ROC AUC of separating members from non-members by loss-like scores (higher = non-member).

    member_scores: ``(N,)`` attack scores of the forget set (members of the original training).
    nonmember_scores: ``(M,)`` attack scores of the holdout set.
    Computed from the Mann-Whitney rank statistic (``scipy.stats.rankdata``, ties averaged); this
    equals ``roc_auc_score`` with the non-members as the positive class.
    """
    members = _checks.vector(member_scores, "member_scores")
    nonmembers = _checks.vector(nonmember_scores, "nonmember_scores")
    n, m = len(members), len(nonmembers)
    ranks = stats.rankdata(np.concatenate([members, nonmembers]))
    u_nonmembers = ranks[n:].sum() - m * (m + 1) / 2.0
    return float(u_nonmembers / (n * m))


def mia_auc_ci(
    member_scores: Any,
    nonmember_scores: Any,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    member_groups: Sequence[Any] | None = None,
    nonmember_groups: Sequence[Any] | None = None,
) -> tuple[float, float]:
    """Bootstrap confidence interval (low, high) of :func:`mia_auc`: members and non-members resampled
    independently (``scipy.stats.bootstrap``, BCa), seeded.

    ``member_groups`` / ``nonmember_groups`` (one label per score, e.g. the recording or session of each
    segment): resample whole groups instead of items (a cluster bootstrap, percentile interval), since
    segments of one recording are not independent draws; both or neither must be given.

    An interval that holds 0.5 means the attack cannot tell members from non-members on this many
    items: the model shows no measurable membership signal, so a lower AUC after unlearning would
    measure nothing.
    """
    members = _checks.vector(member_scores, "member_scores")
    nonmembers = _checks.vector(nonmember_scores, "nonmember_scores")
    if not 0.0 < confidence < 1.0 or n_resamples < 100:
        raise ValueError(f"confidence must be in (0, 1) and n_resamples >= 100, got {confidence}, {n_resamples}")
    if len(members) < 2 or len(nonmembers) < 2:
        raise ValueError(
            f"a confidence interval needs >= 2 members and non-members, got {len(members)} and {len(nonmembers)}"
        )

    if (member_groups is None) != (nonmember_groups is None):
        raise ValueError("give member_groups and nonmember_groups together (or neither)")
    if member_groups is not None:
        return _grouped_ci(members, nonmembers, member_groups, nonmember_groups, confidence, n_resamples, seed)

    def auc(m: np.ndarray, h: np.ndarray, axis: int = -1) -> np.ndarray:
        u = stats.mannwhitneyu(h, m, axis=axis, method="asymptotic").statistic  # U of the non-members
        return u / (m.shape[axis] * h.shape[axis])

    if np.ptp(np.concatenate([members, nonmembers])) == 0:  # every score alike: no signal, nothing to resample
        return 0.5, 0.5
    point = mia_auc(members, nonmembers)
    for method in ("BCa", "percentile") if 0.0 < point < 1.0 else ("percentile",):  # BCa needs spread
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = stats.bootstrap(
                (members, nonmembers),
                auc,
                n_resamples=n_resamples,
                confidence_level=confidence,
                method=method,
                vectorized=True,
                random_state=np.random.default_rng(seed),
            )
        low, high = res.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            break
    return float(low), float(high)


def _group_index(scores: np.ndarray, groups: Sequence[Any], what: str) -> list[np.ndarray]:
    """Indices of ``scores`` per group label (labels in first-seen order)."""
    if len(groups) != len(scores):
        raise ValueError(f"{what}: {len(groups)} group labels for {len(scores)} scores")
    index: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    return [np.asarray(v) for v in index.values()]


def _grouped_ci(
    members: np.ndarray,
    nonmembers: np.ndarray,
    member_groups: Sequence[Any],
    nonmember_groups: Sequence[Any],
    confidence: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile interval of the AUC when whole groups (recordings) of members and of non-members are drawn
    with replacement, each side independently."""
    m_idx = _group_index(members, member_groups, "member_groups")
    h_idx = _group_index(nonmembers, nonmember_groups, "nonmember_groups")
    if len(m_idx) < 2 or len(h_idx) < 2:
        raise ValueError(
            f"a grouped interval needs >= 2 member and non-member groups, got {len(m_idx)} and {len(h_idx)}"
        )
    if np.ptp(np.concatenate([members, nonmembers])) == 0:
        return 0.5, 0.5
    rng = np.random.default_rng(seed)
    values = np.empty(n_resamples)
    for b in range(n_resamples):
        m = members[np.concatenate([m_idx[i] for i in rng.integers(0, len(m_idx), len(m_idx))])]
        h = nonmembers[np.concatenate([h_idx[i] for i in rng.integers(0, len(h_idx), len(h_idx))])]
        values[b] = mia_auc(m, h)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return float(low), float(high)


def recording_of(row: Any) -> str:
    """The recording (session) a manifest row comes from: its ``video`` column, else the ``spk--video`` part of a
    prepared ID (``spk--video--utt[_start_stop]``), else its audio file."""
    if isinstance(row, dict) or hasattr(row, "get"):
        if row.get("video"):
            return f"{row.get('spk_id')}--{row['video']}"
        parts = str(row.get("ID", "")).split("--")
        if len(parts) >= 3:
            return "--".join(parts[:2])
        return str(row.get("wav", row.get("ID")))
    raise ValueError(f"recording_of: expected a manifest row (a mapping), got {type(row).__name__}")


def measurable(ci: tuple[float, float]) -> bool:
    """Whether a MIA AUC interval excludes 0.5 (chance): a membership signal the benchmark can see go away."""
    return not ci[0] <= 0.5 <= ci[1]


def loss_scores(avg_nll: Any) -> np.ndarray:
    """LOSS attack scores: the per-item average answer NLL itself, shape ``(N,)``."""
    return _checks.nll(avg_nll, "avg_nll").copy()


def zlib_scores(avg_nll: Any, texts: Sequence[str]) -> np.ndarray:
    """zlib attack scores ``avg_nll / zlib-compressed byte length of the text``, shape ``(N,)``.

    avg_nll: ``(N,)`` average answer-token NLL. texts: the N answer texts the NLL was computed on.
    """
    nll = _checks.nll(avg_nll, "avg_nll")
    items = _checks.strings(texts, "texts")
    _checks.same_length(avg_nll=nll, texts=items)
    sizes = np.array([len(zlib.compress(t.encode("utf-8"))) for t in items], dtype=np.float64)
    return nll / sizes


def _min_k_mean(values: np.ndarray, k: float) -> float:
    """Mean of the ``max(1, int(k * T))`` smallest values."""
    num = max(1, int(len(values) * k))
    return float(np.sort(values)[:num].mean())


def min_k_scores(token_logprobs: Any, k: float = MIN_K) -> np.ndarray:
    """Min-k% attack scores, shape ``(N,)``.

    token_logprobs: per item a ``(T_i,)`` array of the answer tokens' log-probs (<= 0), as a list
        or a ``(N, T)`` array. k: the fraction of lowest log-probs averaged, in (0, 1].
    """
    k = _checks.unit_fraction(k)
    items = _checks.ragged(token_logprobs, "token_logprobs")
    return np.array([-_min_k_mean(lp, k) for lp in items])


def min_k_plus_plus_scores(token_logprobs: Any, mu: Any, sigma: Any, k: float = MIN_K) -> np.ndarray:
    """Min-k%++ attack scores, shape ``(N,)``.

    token_logprobs: per item ``(T_i,)`` log-probs of the answer tokens.
    mu, sigma: per item ``(T_i,)`` mean and standard deviation of log p(v) over the vocabulary v
        under the model's next-token distribution at each position (``vocab_logprob_moments``);
        sigma below 1e-3 is raised to 1e-3 (the reference's variance floor of 1e-6).
    """
    k = _checks.unit_fraction(k)
    lps = _checks.ragged(token_logprobs, "token_logprobs")
    mus = _checks.ragged(mu, "mu")
    sigmas = _checks.ragged(sigma, "sigma")
    _checks.same_length(token_logprobs=lps, mu=mus, sigma=sigmas)
    scores = []
    for i, (lp, m, s) in enumerate(zip(lps, mus, sigmas)):
        if not len(lp) == len(m) == len(s):
            raise ValueError(f"item {i}: token_logprobs, mu and sigma have lengths {len(lp)}, {len(m)}, {len(s)}")
        if (s < 0).any():
            raise ValueError(f"sigma[{i}]: standard deviations must be >= 0, got {float(s.min()):.4g}")
        z = (lp - m) / np.maximum(s, _SIGMA_FLOOR)
        scores.append(-_min_k_mean(z, k))
    return np.array(scores)


def vocab_logprob_moments(vocab_logprobs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-position mean and standard deviation of log p(v) under p, for min-k%++.

    vocab_logprobs: ``(T, V)`` log-softmax of the model's logits at the T answer positions (numpy or
        torch, any device). Returns ``(mu, sigma)``, each ``(T,)`` float64, with
        ``mu_t = sum_v p log p`` and ``sigma_t = sqrt(max(sum_v p (log p)^2 - mu_t^2, 1e-6))``.
    """
    lp = torch.as_tensor(vocab_logprobs).detach().double()
    if lp.ndim != 2 or lp.shape[0] == 0 or lp.shape[1] == 0:
        raise ValueError(f"vocab_logprobs: expected a non-empty (T, V) array, got shape {tuple(lp.shape)}")
    if torch.isnan(lp).any():
        raise ValueError("vocab_logprobs: contains NaN")
    p = lp.exp()
    # p * log p is 0 where p == 0 (log p = -inf), not NaN.
    plp = torch.where(p > 0, p * lp, torch.zeros_like(lp))
    mu = plp.sum(-1)
    second = torch.where(p > 0, plp * lp, torch.zeros_like(lp)).sum(-1)
    var = (second - mu.square()).clamp_min(_VAR_FLOOR)
    return mu.cpu().numpy(), var.sqrt().cpu().numpy()


def privleak(auc_unlearned: float, auc_retain: float) -> float:
    """Privacy leakage (%) of the evaluated model relative to the retain model (reference formula).

    ``((1 - auc_unlearned) - (1 - auc_retain)) / (1 - auc_retain + 1e-10) * 100`` with both AUCs
    in this module's convention (``mia_auc``; TOFU uses min-k). 0 = as private as the retain
    model; negative = members more exposed than under the retain model. The reference falls back
    to auc_retain = 0.5 when it has no retain logs (``PRIVLEAK_DEFAULT_RETAIN_AUC``).
    """
    for name, value in (("auc_unlearned", auc_unlearned), ("auc_retain", auc_retain)):
        if not 0.0 <= float(value) <= 1.0:  # also rejects NaN
            raise ValueError(f"{name}: an AUC in [0, 1], got {value}")
    if float(auc_retain) == 1.0:
        raise ValueError("auc_retain: privleak is undefined for a retain-model AUC of 1.0")
    score, ref = 1.0 - float(auc_unlearned), 1.0 - float(auc_retain)
    return (score - ref) / (ref + _EPS) * 100.0


PRIVLEAK_DEFAULT_RETAIN_AUC = 0.5  # the reference's ``ref_value`` in privleak.yaml
