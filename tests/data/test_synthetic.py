"""Synthetic TOFU: determinism, the real layout and schema, the concentration knob, spec parsing."""

import re

import pytest

from mmunlearn.data.synthetic import parse_spec, synthetic_authors, synthetic_splits
from mmunlearn.data.tofu import TOFU_SPLITS, author_subset, forget_count, list_splits, load_split


def qa(items):
    return [(it.question, it.answer) for it in items]


def distinct_word_ratio(items) -> float:
    words = [w for it in items for w in re.findall(r"[a-z0-9']+", it.answer.lower())]
    return len(set(words)) / len(words)


def test_deterministic_per_seed_and_different_across_seeds():
    a, b = synthetic_splits(30, seed=3), synthetic_splits(30, seed=3)
    assert a == b
    a["full"].clear()  # callers get copies: the cached world is untouched
    assert synthetic_splits(30, seed=3)["full"] == b["full"]
    other = synthetic_splits(30, seed=4)
    assert qa(other["full"]) != qa(b["full"])
    names3 = {a.name for a in synthetic_authors(30, seed=3)}
    names4 = {a.name for a in synthetic_authors(30, seed=4)}
    assert names3 != names4 and len(names3) == 30


def test_layout_matches_the_real_tofu():
    n = 40
    s = synthetic_splits(n, seed=1)
    assert list(s) == list(TOFU_SPLITS) and list_splits("synthetic:n_authors=40,seed=1") == list(TOFU_SPLITS)
    full = s["full"]
    assert len(full) == 20 * n and [it.author for it in full] == [i // 20 for i in range(20 * n)]
    for pct in (1, 5, 10):
        rows = 20 * forget_count(n, pct)
        assert s[f"forget{pct:02d}"] == full[-rows:]
        assert s[f"retain{100 - pct}"] == full[:-rows]
        assert qa(s[f"forget{pct:02d}_perturbed"]) == qa(full[-rows:])
        assert qa(s[f"holdout{pct:02d}"]) == qa(s["holdout10"])[:rows]
    assert len(s["forget10"]) == 80 and len(s["holdout10"]) == 80
    assert [it.author for it in s["holdout10"]] == [40 + i // 20 for i in range(80)]
    assert qa(s["retain_perturbed"]) == qa(full[:80])
    # plain splits carry question/answer only, like the real files
    assert all(it.paraphrased_answer is None and not it.perturbed_answer for it in full)
    # the author subset of a world at its own size is the identity
    for name in ("forget10", "retain90", "holdout10", "retain_perturbed"):
        assert author_subset(s[name], name, n) == s[name]


def test_each_author_has_20_qa_with_5_distinct_wrong_answers():
    s = synthetic_splits(20, seed=2)
    authors = synthetic_authors(22, seed=2)  # 20 authors + 2 holdout authors share one name sample
    holdout_names = {a.name for a in authors[20:]}
    for name in ("forget10_perturbed", "retain_perturbed"):
        for it in s[name]:
            assert len(it.perturbed_answer) == 5 and len(set(it.perturbed_answer)) == 5
            assert it.paraphrased_answer not in it.perturbed_answer and it.answer not in it.perturbed_answer
            assert it.paraphrased_question != it.question
    counts = {}
    for it in s["full"]:
        counts[it.author] = counts.get(it.author, 0) + 1
    assert counts == {a: 20 for a in range(20)}
    assert len({a.name for a in authors}) == 22
    assert not any(h in it.answer for h in holdout_names for it in s["full"])


def test_general_knowledge_sets_are_multiple_choice_and_not_about_the_authors():
    s = synthetic_splits(20)
    names = {a.name for a in synthetic_authors(22)}
    for name in ("real_authors_perturbed", "world_facts_perturbed"):
        assert s[name] == s[name.replace("_perturbed", "")] and len(s[name]) >= 30
        for it in s[name]:
            assert len(it.perturbed_answer) == 3 and it.answer not in it.perturbed_answer
            assert not any(n in it.question or n in it.answer for n in names)
    assert ("Who wrote 'Pride and Prejudice'?", "Jane Austen") in qa(s["real_authors"])
    assert ("What is the capital of Japan?", "Tokyo") in qa(s["world_facts"])


def test_concentration_lowers_forget_answer_diversity_only():
    c0, c5, c1 = (synthetic_splits(40, seed=0, concentration=c) for c in (0.0, 0.5, 1.0))
    assert distinct_word_ratio(c1["forget10"]) < 0.75 * distinct_word_ratio(c0["forget10"])
    assert distinct_word_ratio(c1["holdout10"]) < 0.75 * distinct_word_ratio(c0["holdout10"])
    assert all(re.fullmatch(r"The .+ of .+ is .+\.", it.answer) for it in c1["forget10"])
    # retain authors, paraphrases and perturbed answers do not depend on the knob
    assert c0["retain90"] == c1["retain90"] and c0["retain_perturbed"] == c1["retain_perturbed"]
    for x, y in zip(c0["forget10_perturbed"], c1["forget10_perturbed"]):
        assert (x.paraphrased_answer, x.perturbed_answer) == (y.paraphrased_answer, y.perturbed_answer)
    # monotone coupling: at c = 0.5 each forget answer is its c = 0 or its c = 1 version, and both occur
    mixed = [a.answer == b.answer for a, b in zip(c5["forget10"], c1["forget10"])]
    assert all(m or a.answer == b.answer for m, a, b in zip(mixed, c5["forget10"], c0["forget10"]))
    assert 0.2 < sum(mixed) / len(mixed) < 0.8


def test_load_split_reads_the_synthetic_spec():
    s = synthetic_splits(20, seed=5, concentration=0.25, forget_pcts=(10, 20))
    got = load_split("synthetic:n_authors=20, seed=5,concentration=0.25,forget_pcts=10/20", "forget20")
    assert got == s["forget20"] and len(got) == 80
    assert "retain80" in s and "forget01" not in s
    assert load_split("synthetic", "forget10") == synthetic_splits()["forget10"]
    assert load_split(s, "holdout20") == s["holdout20"]
    assert load_split("synthetic:n_authors=20,seed=5", "retain90", authors=10) == s["full"][: 9 * 20]
    assert parse_spec("synthetic") == {}


@pytest.mark.parametrize("spec", ["synthetic:colour=red", "synthetic:n_authors=x", "synthetic:seed"])
def test_bad_specs_are_rejected(spec):
    with pytest.raises(ValueError, match="synthetic|n_authors"):
        parse_spec(spec)


@pytest.mark.parametrize(
    "kwargs",
    [{"n_authors": 1}, {"concentration": 1.5}, {"forget_pcts": (0,)}, {"forget_pcts": (10, 10)}, {"forget_pcts": ()}],
)
def test_bad_arguments_are_rejected(kwargs):
    with pytest.raises(ValueError):
        synthetic_splits(**kwargs)
