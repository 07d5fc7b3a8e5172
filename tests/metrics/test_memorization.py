"""Exact memorisation and extraction strength from per-token greedy matches."""

import numpy as np
import pytest
import torch

from mmunlearn.metrics import exact_memorization, extraction_strength, token_matches


def _reference_loop(m):
    """The reference's search written out: first k in 0..T-1 whose suffix matches, else T-1."""
    t = len(m)
    for k in range(t):
        if all(m[k:]):
            break
    return 1 - k / t


def test_exact_memorization_hand_values():
    em = exact_memorization([[1, 1, 0, 1], [True, False], np.zeros(3, bool)])
    np.testing.assert_allclose(em, [0.75, 0.5, 0.0])
    assert exact_memorization(torch.tensor([[True, True]]))[0] == 1.0


def test_extraction_strength_hand_values():
    es = extraction_strength([[1, 1, 1, 1], [0, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_allclose(es, [1.0, 0.75, 0.5, 0.25])


def test_extraction_strength_keeps_reference_value_when_no_suffix_matches():
    # last token wrong: the reference leaves k at T-1, so ES = 1/T (not 0)
    np.testing.assert_allclose(extraction_strength([[1, 1, 1, 0], [0, 0]]), [0.25, 0.5])


def test_extraction_strength_matches_the_reference_search_on_random_items():
    rng = np.random.default_rng(0)
    items = [rng.random(rng.integers(1, 9)) < 0.7 for _ in range(200)]
    np.testing.assert_allclose(extraction_strength(items), [_reference_loop(m) for m in items])


def test_token_matches():
    np.testing.assert_array_equal(token_matches([1, 2, 3], torch.tensor([1, 5, 3])), [True, False, True])
    with pytest.raises(ValueError, match="lengths"):
        token_matches([1, 2], [1])


@pytest.mark.parametrize("fn", [exact_memorization, extraction_strength])
def test_bad_inputs(fn):
    with pytest.raises(ValueError, match="empty"):
        fn([[1, 0], []])
    with pytest.raises(ValueError, match="booleans"):
        fn([[1, 2]])
    with pytest.raises(ValueError, match="empty"):
        fn([])
