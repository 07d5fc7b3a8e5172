"""Log entries: the reference evaluator's per-key layout, values and index handling."""

import math

import numpy as np
import pytest

from mmunlearn.metrics import (
    agg_entry,
    mia_entry,
    normalised_prob_entry,
    per_item,
    prob_entry,
    rouge_entry,
    score_entry,
    truth_ratio_entry,
)

LN2, LN4 = math.log(2), math.log(4)


def test_prob_entry_single_answer_layout():
    e = prob_entry([0.0, LN2])
    assert set(e) == {"agg_value", "value_by_index"}
    assert e["agg_value"] == pytest.approx(0.75)
    assert list(e["value_by_index"]) == ["0", "1"]
    assert e["value_by_index"]["1"] == {"prob": pytest.approx(0.5), "avg_loss": pytest.approx(LN2)}
    assert type(e["value_by_index"]["1"]["prob"]) is float


def test_prob_entry_candidates_are_lists():
    e = prob_entry([[0.0, LN2], [LN4, LN4]], indices=[7, 3])
    assert list(e["value_by_index"]) == ["7", "3"]
    assert e["value_by_index"]["7"]["prob"] == pytest.approx([1.0, 0.5])
    assert e["value_by_index"]["3"]["avg_loss"] == pytest.approx([LN4, LN4])
    assert e["agg_value"] == pytest.approx(0.5)


def test_truth_ratio_entry_scores_are_raw_ratios():
    e = truth_ratio_entry([LN2, LN4], [[LN4], [LN2]], "closer_to_1_better")
    assert [v["score"] for v in e["value_by_index"].values()] == pytest.approx([0.5, 2.0])
    assert e["agg_value"] == pytest.approx(0.5)
    e = truth_ratio_entry([LN2, LN4], [[LN4], [LN2]], "true_better")
    assert e["agg_value"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="aggregator"):
        truth_ratio_entry([LN2], [[LN4]], "mean")


def test_normalised_prob_entry():
    e = normalised_prob_entry([LN2, 0.0], [[LN4, LN4], [LN2, LN2]])
    assert [v["prob"] for v in e["value_by_index"].values()] == pytest.approx([0.5, 0.5])
    assert e["agg_value"] == pytest.approx(0.5)


def test_rouge_entry_fields_and_aggregate():
    e = rouge_entry(["He was born in Paris", "no"], ["The author was born in Paris, France.", "yes"], ["Q1?", "Q2?"])
    item = e["value_by_index"]["0"]
    assert set(item) == {"rouge1_recall", "rougeL_f1", "rougeL_recall", "input", "ground_truth", "generation"}
    assert item["input"] == "Q1?" and item["generation"] == "He was born in Paris"
    assert e["agg_value"] == pytest.approx((4 / 7 + 0.0) / 2)
    assert rouge_entry(["c b a"], ["a b c"], rouge_type="rouge1_recall")["agg_value"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rouge_type"):
        rouge_entry(["a"], ["a"], rouge_type="rouge2")
    with pytest.raises(ValueError, match="mismatched"):
        rouge_entry(["a"], ["a"], questions=["q1", "q2"])


def test_score_entry_indices():
    e = score_entry([0.2, 0.4], indices=np.array([5, 9]))
    assert e == {"agg_value": pytest.approx(0.3), "value_by_index": {"5": {"score": 0.2}, "9": {"score": 0.4}}}
    with pytest.raises(ValueError, match="unique"):
        score_entry([0.2, 0.4], indices=[1, 1])
    with pytest.raises(ValueError, match="2 items"):
        score_entry([0.2, 0.4], indices=[1])


def test_mia_entry_layout():
    e = mia_entry([0.1, 0.2], [0.3, 0.4, 0.5], nonmember_indices=[10, 11, 12])
    assert set(e) == {"forget", "holdout", "auc", "agg_value"}
    assert e["auc"] == e["agg_value"] == 1.0
    assert e["forget"]["agg_value"] == pytest.approx(0.15)
    assert list(e["holdout"]["value_by_index"]) == ["10", "11", "12"]


def test_agg_entry():
    assert agg_entry(np.float64(0.25)) == {"agg_value": 0.25}
    assert agg_entry(None) == {"agg_value": None}
    with pytest.raises(ValueError, match="NaN"):
        agg_entry(float("nan"))


def test_per_item_orders_indices_numerically():
    e = {"agg_value": 0.0, "value_by_index": {"10": {"score": 3.0}, "2": {"score": 2.0}, "1": {"score": 1.0}}}
    np.testing.assert_array_equal(per_item(e), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="'prob'"):
        per_item(e, "prob")
    with pytest.raises(ValueError, match="value_by_index"):
        per_item({"agg_value": 1.0})
