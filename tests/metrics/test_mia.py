"""MIA scores (loss, zlib, min-k, min-k++), AUC and its direction, privleak."""

import itertools
import math
import zlib

import numpy as np
import pytest
import torch

from mmunlearn.metrics import (
    loss_scores,
    mia_auc,
    min_k_plus_plus_scores,
    min_k_scores,
    privleak,
    vocab_logprob_moments,
    zlib_scores,
)


def test_auc_is_one_when_members_have_lower_loss_and_zero_when_higher():
    assert mia_auc([0.1, 0.2, 0.3], [1.0, 2.0]) == 1.0
    assert mia_auc([1.0, 2.0], [0.1, 0.2, 0.3]) == 0.0


def test_auc_is_half_for_identical_distributions():
    assert mia_auc([1.0, 2.0, 3.0], [3.0, 1.0, 2.0]) == pytest.approx(0.5)


def test_auc_hand_values_with_and_without_ties():
    # pairs with non-member > member: (2>1), (4>1), (4>3) of 4 -> 0.75
    assert mia_auc([1.0, 3.0], [2.0, 4.0]) == pytest.approx(0.75)
    # (2>1), tie (2=2) counts 1/2, (3>1), (3>2) -> 3.5 / 4
    assert mia_auc([1.0, 2.0], [2.0, 3.0]) == pytest.approx(0.875)


def test_auc_equals_pairwise_count_on_random_scores():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 6, 13).astype(float), rng.integers(0, 6, 9).astype(float)
    pairs = [(1.0 if y > x else 0.5 if y == x else 0.0) for x, y in itertools.product(a, b)]
    assert mia_auc(a, b) == pytest.approx(sum(pairs) / len(pairs))


def test_loss_scores_are_the_average_nll():
    nll = np.array([0.5, 2.0])
    out = loss_scores(nll)
    np.testing.assert_array_equal(out, nll)
    out[0] = 9.0
    assert nll[0] == 0.5  # a copy, the input is untouched
    with pytest.raises(ValueError, match="log-probabilities"):
        loss_scores([-0.5])


def test_zlib_scores_divide_by_compressed_length():
    # An empty zlib stream is 8 bytes (2 header + 2 empty block + 4 Adler-32).
    s = zlib_scores([2.0, 3.0], ["", "a" * 1000])
    assert s[0] == pytest.approx(2.0 / 8)
    assert s[1] == pytest.approx(3.0 / len(zlib.compress(b"a" * 1000)))
    with pytest.raises(ValueError, match="mismatched"):
        zlib_scores([1.0], ["a", "b"])
    with pytest.raises(ValueError, match="str"):
        zlib_scores([1.0], [b"bytes"])


def test_min_k_hand_values():
    # k = 0.4 of 5 tokens -> the 2 lowest (-5, -4) -> score 4.5; of 2 tokens -> at least 1 -> 1.5
    s = min_k_scores([[-1.0, -2.0, -3.0, -4.0, -5.0], [-0.5, -1.5]])
    np.testing.assert_allclose(s, [4.5, 1.5])
    assert min_k_scores([[-1.0, -2.0, -3.0, -4.0, -5.0]], k=1.0)[0] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="fraction"):
        min_k_scores([[-1.0]], k=0.0)


def test_min_k_direction_members_with_higher_logprobs_give_high_auc():
    members = min_k_scores([[-0.1, -0.2, -0.05], [-0.3, -0.1]])
    nonmembers = min_k_scores([[-2.0, -3.0, -1.0], [-4.0, -2.5]])
    assert mia_auc(members, nonmembers) == 1.0


def test_min_k_plus_plus_hand_values():
    # z = (lp - mu) / sigma = [0, -2]; k = 0.5 -> lowest one -> score 2
    s = min_k_plus_plus_scores([[-1.0, -2.0]], [[-1.0, -1.0]], [[1.0, 0.5]], k=0.5)
    assert s[0] == pytest.approx(2.0)
    # sigma 0 is floored at 1e-3: z = -0.5 / 1e-3
    s = min_k_plus_plus_scores([[-1.0]], [[-0.5]], [[0.0]])
    assert s[0] == pytest.approx(500.0)


def test_min_k_plus_plus_checks_lengths_and_sign():
    with pytest.raises(ValueError, match="lengths"):
        min_k_plus_plus_scores([[-1.0, -2.0]], [[-1.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match=">= 0"):
        min_k_plus_plus_scores([[-1.0]], [[-1.0]], [[-1.0]])


def test_vocab_moments_hand_values_torch_and_numpy():
    p = np.array([[0.5, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]])
    with np.errstate(divide="ignore"):
        lp = np.log(p)
    mu, sigma = vocab_logprob_moments(lp)
    # row 0: mu = -1.5 ln2, var = 2.5 ln2^2 - 2.25 ln2^2 -> sigma = 0.5 ln2 (p = 0 adds nothing)
    np.testing.assert_allclose(mu, [-1.5 * math.log(2), -math.log(4)])
    np.testing.assert_allclose(sigma, [0.5 * math.log(2), 1e-3])  # uniform: variance floored
    mu_t, sigma_t = vocab_logprob_moments(torch.from_numpy(lp).float())
    np.testing.assert_allclose(mu_t, mu, rtol=1e-6)
    np.testing.assert_allclose(sigma_t, sigma, rtol=1e-6)
    with pytest.raises(ValueError, match=r"\(T, V\)"):
        vocab_logprob_moments(lp[0])


def test_privleak_reference_formula_and_direction():
    assert privleak(0.75, 0.5) == pytest.approx(-50.0)  # members more exposed than the retain model
    assert privleak(0.5, 0.5) == pytest.approx(0.0)
    assert privleak(0.25, 0.5) == pytest.approx(50.0)
    assert privleak(0.6, 0.4) == pytest.approx((0.4 - 0.6) / 0.6 * 100)


@pytest.mark.parametrize("args", [(1.2, 0.5), (0.5, -0.1), (float("nan"), 0.5), (0.5, 1.0)])
def test_privleak_rejects_bad_aucs(args):
    with pytest.raises(ValueError, match="auc"):
        privleak(*args)


def test_auc_rejects_nan_and_empty():
    with pytest.raises(ValueError, match="NaN"):
        mia_auc([0.1, float("nan")], [0.2])
    with pytest.raises(ValueError, match="empty"):
        mia_auc([], [0.2])
    with pytest.raises(ValueError, match="empty"):
        min_k_scores([[]])
    with pytest.raises(ValueError, match="per-item"):
        min_k_scores(np.array([-1.0, -2.0]))  # one item must be wrapped: [[-1.0, -2.0]]


def test_mia_auc_interval_holds_chance_only_without_a_signal():
    from mmunlearn.metrics.mia import measurable, mia_auc_ci

    rng = np.random.default_rng(0)
    members, same, higher = rng.normal(0, 1, 200), rng.normal(0, 1, 200), rng.normal(0.8, 1, 200)
    low, high = mia_auc_ci(members, same)
    assert low < mia_auc(members, same) < high and low <= 0.5 <= high and not measurable((low, high))
    low, high = mia_auc_ci(members, higher)  # non-members score higher losses: a real membership signal
    assert 0.5 < low < mia_auc(members, higher) < high and measurable((low, high))
    assert mia_auc_ci(members, higher) == (low, high)  # seeded
    wide = mia_auc_ci(members[:20], higher[:20])
    assert wide[1] - wide[0] > high - low  # fewer items, a wider interval
    assert mia_auc_ci(members, members + 100) == (1.0, 1.0)  # a perfect split: no BCa, percentiles
    with pytest.raises(ValueError):
        mia_auc_ci(members[:1], same)


def test_interval_by_recording_is_wider_when_segments_of_a_recording_agree():
    from mmunlearn.metrics.mia import mia_auc_ci

    rng = np.random.default_rng(1)
    # 8 member and 8 non-member recordings, 6 segments each; segments of one recording share its level
    m_level, h_level = rng.normal(0.0, 1.0, 8), rng.normal(0.6, 1.0, 8)
    members = np.repeat(m_level, 6) + rng.normal(0, 0.05, 48)
    nonmembers = np.repeat(h_level, 6) + rng.normal(0, 0.05, 48)
    groups_m, groups_h = np.repeat(np.arange(8), 6), np.repeat(np.arange(8), 6)
    lo, hi = mia_auc_ci(members, nonmembers, seed=0)
    glo, ghi = mia_auc_ci(members, nonmembers, seed=0, member_groups=groups_m, nonmember_groups=groups_h)
    assert ghi - glo > 1.3 * (hi - lo)  # 48 segments are 8 draws, not 48
    assert glo <= mia_auc(members, nonmembers) <= ghi
    with pytest.raises(ValueError, match="together"):
        mia_auc_ci(members, nonmembers, member_groups=groups_m)
    with pytest.raises(ValueError, match="group labels"):
        mia_auc_ci(members, nonmembers, member_groups=groups_m[:5], nonmember_groups=groups_h)


def test_recording_of_reads_the_session_of_a_prepared_row():
    from mmunlearn.metrics.mia import recording_of

    assert recording_of({"ID": "id1--vidA--00001_0_48000", "spk_id": "id1"}) == "id1--vidA"
    assert recording_of({"ID": "x", "spk_id": "s", "video": "v"}) == "s--v"
    assert recording_of({"ID": "plain", "wav": "/a/b.wav"}) == "/a/b.wav"
