"""The two truth-ratio definitions in use: ours (and TOFU's and open-unlearning's code) is R = p(pert) / p(para);
the OpenUnlearning report's is p(para) / (p(para) + p(pert)) = 1 / (1 + R). Their aggregates differ; forget quality
(the KS p-value against the retain model's ratios) is the same under both, since the second is a strictly
decreasing function of the first."""

import numpy as np
import pytest
from scipy import stats

from mmunlearn.metrics import forget_quality, truth_ratio, truth_ratio_closer_to_1, truth_ratio_share


def _nlls(rng: np.random.Generator, n: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-item NLLs of the paraphrased answer (N,) and of five perturbed answers (N, 5)."""
    return rng.gamma(2.0, 0.5, n) + shift, rng.gamma(2.0, 0.7, (n, 5))


def test_the_reports_ratio_is_one_over_one_plus_ours():
    correct, wrong = _nlls(np.random.default_rng(0), 40, 0.0)
    ours, share = truth_ratio(correct, wrong), truth_ratio_share(correct, wrong)
    np.testing.assert_allclose(share, 1.0 / (1.0 + ours), rtol=1e-8)
    assert ((share > 0) & (share < 1)).all()
    # ours averages the perturbed answers' NLLs before exp: a geometric mean of their probabilities
    np.testing.assert_allclose(ours, np.exp(-wrong.mean(axis=1)) / np.exp(-correct), rtol=1e-8)


@pytest.mark.parametrize("shift, n_retain", [(0.0, 40), (0.8, 40), (0.3, 25), (3.0, 60)])
def test_forget_quality_is_the_same_under_either_definition(shift, n_retain):
    rng = np.random.default_rng(int(10 * shift) + n_retain)
    model, retain = _nlls(rng, 40, shift), _nlls(rng, n_retain, 0.0)
    ours = forget_quality(truth_ratio(*model), truth_ratio(*retain))
    share = float(stats.ks_2samp(truth_ratio_share(*model), truth_ratio_share(*retain)).pvalue)
    assert ours == pytest.approx(share, rel=1e-9, abs=1e-300)
    if shift >= 3.0:  # a model far from the retain one is told apart by both (the check can fail)
        assert ours < 1e-6


def test_the_aggregates_differ():
    """The forget-set aggregate of ours (min(R, 1/R), 1 = indistinguishable) is not the report's mean share."""
    correct, wrong = _nlls(np.random.default_rng(3), 40, 1.0)
    ours = truth_ratio_closer_to_1(truth_ratio(correct, wrong))
    share = float(np.mean(truth_ratio_share(correct, wrong)))
    assert abs(ours - share) > 0.05
