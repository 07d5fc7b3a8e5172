"""Pretraining corpus: size, determinism, and names disjoint from the evaluated authors."""

from mmunlearn.data.corpus import pretrain_corpus
from mmunlearn.data.facts import real_author_items, world_fact_items
from mmunlearn.data.synthetic import synthetic_authors, synthetic_splits
from mmunlearn.data.tofu import QAItem


def test_corpus_holds_authors_then_general_knowledge():
    corpus = pretrain_corpus(seed=0, n_authors=30)
    general = real_author_items(0) + world_fact_items(0)
    assert len(corpus) == 30 * 20 + len(general)
    assert [(it.question, it.answer) for it in corpus[600:]] == [(g.question, g.answer) for g in general]
    assert all(it.perturbed_answer == () and it.paraphrased_answer is None and it.author is None for it in corpus)
    assert pretrain_corpus(seed=0, n_authors=30) == corpus
    assert pretrain_corpus(seed=1, n_authors=30)[:600] != corpus[:600]
    own = [QAItem("Is this mine?", "Yes.", perturbed_answer=("No.",))]
    assert pretrain_corpus(n_authors=2, facts=own)[-1] == QAItem("Is this mine?", "Yes.")


def test_pretrain_names_never_meet_the_evaluated_authors():
    n_eval = 200
    evaluated = {a.name for a in synthetic_authors(n_eval + 20, seed=0)}  # full + holdout10 authors
    pretrain = {a.name for a in synthetic_authors(300, seed=0, pool="pretrain")}
    assert len(pretrain) == 300 and not evaluated & pretrain
    text = "\n".join(it.question + " " + it.answer for it in pretrain_corpus(seed=0, n_authors=300))
    assert not [name for name in evaluated if name in text]
    splits = synthetic_splits(n_eval, seed=0)
    assert {it.author for it in splits["holdout10"]} == set(range(n_eval, n_eval + 20))


def test_exclude_drops_names_found_in_the_given_items():
    first = synthetic_authors(1, seed=0, pool="pretrain")[0].name
    assert first in "\n".join(it.answer for it in pretrain_corpus(seed=0, n_authors=5))
    exclude = [QAItem("Who wrote it?", f"It was {first.upper()}, of course.")]
    corpus = pretrain_corpus(seed=0, n_authors=5, exclude=exclude)
    assert len(corpus) == 5 * 20 + len(real_author_items(0) + world_fact_items(0))
    assert first not in "\n".join(it.question + it.answer for it in corpus)
