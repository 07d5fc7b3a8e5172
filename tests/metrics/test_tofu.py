"""TOFU scores: prob, truth ratio and its two aggregators, normalised prob, forget quality, utility."""

import math

import numpy as np
import pytest
import torch

from mmunlearn.metrics import (
    MODEL_UTILITY_KEYS,
    forget_quality,
    harmonic_mean,
    model_utility,
    model_utility_rouge,
    normalised_prob,
    prob_from_nll,
    qa_prob,
    truth_ratio,
    truth_ratio_closer_to_1,
    truth_ratio_true_better,
)

LN2, LN4, LN16 = math.log(2), math.log(4), math.log(16)


def test_prob_is_exp_of_minus_average_nll():
    np.testing.assert_allclose(prob_from_nll([0.0, LN2, LN4]), [1.0, 0.5, 0.25])
    assert qa_prob([0.0, LN2]) == pytest.approx(0.75)


def test_prob_with_candidates_averages_probs_not_nlls():
    # item 0: probs 1 and 1/2 -> 0.75 (exp of the mean NLL would be 0.707); item 1: 1/4 and 1/4.
    assert qa_prob([[0.0, LN2], [LN4, LN4]]) == pytest.approx((0.75 + 0.25) / 2)
    assert prob_from_nll([[0.0, LN2]]).shape == (1, 2)


def test_truth_ratio_hand_values():
    # p(correct) = 1/2, p(wrong) = 1/4 -> R = 1/2 ; p(correct) = 1/4, p(wrong) = 1/2 -> R = 2.
    r = truth_ratio([LN2, LN4], [[LN4, LN4], [LN2, LN2]])
    np.testing.assert_allclose(r, [0.5, 2.0], rtol=1e-8)


def test_truth_ratio_averages_wrong_candidates_in_nll_space():
    # NLLs 0 and ln16 average to ln4 -> p = 1/4 -> R = 0.5 (averaging probs would give 1.0625).
    r = truth_ratio([LN2], [[0.0, LN16]])
    assert r[0] == pytest.approx(0.5, rel=1e-8)


def test_truth_ratio_one_wrong_answer_per_item_as_1d():
    np.testing.assert_allclose(truth_ratio([LN2], [LN4]), [0.5], rtol=1e-8)


def test_closer_to_1_aggregate_is_symmetric_in_r_and_1_over_r():
    assert truth_ratio_closer_to_1([0.5, 2.0]) == pytest.approx(0.5)
    assert truth_ratio_closer_to_1([1.0]) == pytest.approx(1.0)
    assert truth_ratio_closer_to_1([0.25]) == pytest.approx(truth_ratio_closer_to_1([4.0]))
    assert truth_ratio_closer_to_1([4.0]) == pytest.approx(0.25)


def test_true_better_aggregate_clips_at_zero():
    assert truth_ratio_true_better([0.25, 1.5]) == pytest.approx((0.75 + 0.0) / 2)
    assert truth_ratio_true_better([0.0]) == 1.0


def test_aggregators_reject_negative_ratios():
    with pytest.raises(ValueError, match=">= 0"):
        truth_ratio_closer_to_1([0.5, -1.0])
    with pytest.raises(ValueError, match=">= 0"):
        truth_ratio_true_better([-0.1])


def test_normalised_prob_hand_values():
    # 0.5 / (0.5 + 0.25 + 0.25) = 0.5 ; 1 / (1 + 3 * 0.5) = 0.4
    p = normalised_prob([LN2, 0.0], [[LN4, LN4, 30.0], [LN2, LN2, LN2]])
    np.testing.assert_allclose(p, [0.5 / (0.5 + 0.5 + math.exp(-30)), 0.4], rtol=1e-8)


def test_forget_quality_identical_samples_is_one_and_separated_is_tiny():
    r = np.array([0.3, 0.9, 1.2, 2.5])
    assert forget_quality(r, r[::-1].copy()) == pytest.approx(1.0)
    assert forget_quality(np.arange(20.0), np.arange(20.0) + 100) < 1e-9
    # different sample sizes are allowed
    assert 0.0 < forget_quality([0.1, 0.2, 0.3], [0.15, 0.25]) <= 1.0


def test_harmonic_mean_hand_value_zero_and_bad_values():
    assert harmonic_mean([1.0, 2.0, 4.0]) == pytest.approx(3 / 1.75)
    assert harmonic_mean([0.5, 0.0, 0.9]) == 0.0
    bad_cases = (
        ([1.0, -0.5], "non-negative"),
        ([1.0, float("nan")], "NaN"),
        ([1.0, math.inf], "finite"),
        ([], "empty"),
    )
    for bad, msg in bad_cases:
        with pytest.raises(ValueError, match=msg):
            harmonic_mean(bad)


def test_model_utility_is_hmean_of_the_nine_named_values():
    comps = {k: 1.0 for k in MODEL_UTILITY_KEYS}
    comps[MODEL_UTILITY_KEYS[4]] = 0.25
    comps["forget_Q_A_Prob"] = 123.0  # not a utility component: ignored
    assert model_utility(comps) == pytest.approx(9 / (8 + 4))
    comps[MODEL_UTILITY_KEYS[0]] = 0.0
    assert model_utility(comps) == 0.0


def test_model_utility_accepts_log_entries_and_names_missing_keys():
    entries = {k: {"agg_value": 0.5, "value_by_index": {}} for k in MODEL_UTILITY_KEYS}
    assert model_utility(entries) == pytest.approx(0.5)
    del entries["wf_Truth_Ratio"]
    with pytest.raises(ValueError, match="wf_Truth_Ratio"):
        model_utility(entries)


def test_model_utility_rouge_uses_the_three_rouge_scores():
    comps = {"retain_Q_A_ROUGE": 0.5, "ra_Q_A_ROUGE": 1.0, "wf_Q_A_ROUGE": 1.0, "retain_Q_A_Prob": 0.0}
    assert model_utility_rouge(comps) == pytest.approx(3 / (2 + 1 + 1))


def test_torch_and_numpy_inputs_agree():
    nll = [[0.3, 1.7], [2.2, 0.1]]
    a = truth_ratio(np.array([0.5, 1.0]), np.array(nll))
    b = truth_ratio(torch.tensor([0.5, 1.0], dtype=torch.bfloat16).float(), torch.tensor(nll))
    np.testing.assert_allclose(a, b, rtol=1e-6)
    assert qa_prob(torch.tensor([0.0, LN2], dtype=torch.bfloat16)) == pytest.approx(0.75, rel=1e-2)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: truth_ratio([0.1, float("nan")], [[0.2], [0.3]]), "NaN"),
        (lambda: truth_ratio([0.1, 0.2], [[0.2], [0.3], [0.4]]), "mismatched"),
        (lambda: truth_ratio([], []), "empty"),
        (lambda: normalised_prob([0.1], [[0.2], [0.3]]), "mismatched"),
        (lambda: qa_prob([-1.2, -0.3]), "log-probabilities"),
        (lambda: qa_prob([[[0.1]]]), "1-D or 2-D"),
        (lambda: forget_quality([], [0.1]), "empty"),
        (lambda: forget_quality([0.1], [float("nan")]), "NaN"),
        (lambda: prob_from_nll([[0.1, 0.2], [0.3]]), "expected numbers"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_inputs_are_not_modified():
    nll = np.array([[0.5, 1.0], [2.0, 0.25]])
    before = nll.copy()
    truth_ratio(nll[:, 0], nll)
    normalised_prob(nll[:, 0], nll)
    np.testing.assert_array_equal(nll, before)
