"""ROUGE recall of generations against reference answers (stemmed, reference as target)."""

import pytest

from mmunlearn.metrics import ROUGE_FIELDS, rouge_l_recall, rouge_scores
from mmunlearn.metrics.rouge import non_latin, script_tokens

REF = "The author was born in Paris, France."
GEN = "He was born in Paris"


def test_rouge_hand_values_of_a_known_pair():
    s = rouge_scores([GEN], [REF])
    assert set(s) == set(ROUGE_FIELDS)
    # reference tokens: the author was born in paris france (7); common subsequence: was born in paris
    assert s["rougeL_recall"][0] == pytest.approx(4 / 7)
    assert s["rouge1_recall"][0] == pytest.approx(4 / 7)
    assert s["rougeL_f1"][0] == pytest.approx(2 / 3)  # precision 4/5, recall 4/7


def test_recall_is_measured_against_the_reference():
    assert rouge_l_recall([REF], [GEN])[0] == pytest.approx(4 / 5)  # 4 of the 5 tokens of GEN
    assert rouge_l_recall([GEN], [REF])[0] == pytest.approx(4 / 7)


def test_stemming_is_on():
    assert rouge_l_recall(["cat run"], ["the cats are running"])[0] == pytest.approx(0.5)


def test_rouge_l_uses_order_rouge_1_does_not():
    s = rouge_scores(["c b a"], ["a b c"])
    assert s["rouge1_recall"][0] == pytest.approx(1.0)
    assert s["rougeL_recall"][0] == pytest.approx(1 / 3)


def test_bad_inputs():
    with pytest.raises(ValueError, match="mismatched"):
        rouge_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="single str"):
        rouge_scores("abc", "abc")
    with pytest.raises(ValueError, match="str"):
        rouge_scores([None], ["a"])
    with pytest.raises(ValueError, match="empty"):
        rouge_scores([], [])


def test_non_latin_references_are_tokenised_by_script():
    # rouge_score's own tokenizer would give 0 for all of these (it keeps [a-z0-9] only)
    ja = "著者はハイメ・バスケスです。"
    assert rouge_l_recall([ja], [ja])[0] == 1.0
    half = rouge_l_recall(["著者は"], ["著者はハイメ"])[0]
    assert half == pytest.approx(3 / 6)
    ar = "المؤلف هو خايمي فاسكيز"
    assert rouge_l_recall(["المؤلف هو شخص آخر"], [ar])[0] == pytest.approx(2 / 4)
    hi = "लेखक का नाम हाइमे है"
    assert script_tokens(hi) == ["लेखक", "का", "नाम", "हाइमे", "है"]  # vowel signs stay inside words
    assert rouge_l_recall([hi], [hi])[0] == 1.0
    ko = "저자는 하이메 바스케스입니다"
    assert rouge_l_recall(["저자는 누구"], [ko])[0] == pytest.approx(1 / 3)


def test_latin_references_keep_the_reference_tokenizer():
    from rouge_score import rouge_scorer

    ref, gen = "The author's novels were praised", "the authors novel was praised widely"
    want = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(ref, gen)["rougeL"].recall
    assert rouge_l_recall([gen], [ref])[0] == want
    assert not non_latin("Aurelio Beltrán") and non_latin("Beltrán ベルトラン")
