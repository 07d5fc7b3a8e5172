"""Pretraining corpus for small model presets: fictitious authors disjoint from the evaluated ones,
plus the general-knowledge QA (real authors, world facts) that model utility later checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mmunlearn.data.facts import real_author_items, world_fact_items
from mmunlearn.data.qa import QAItem
from mmunlearn.data.synthetic import author_items, synthetic_authors


def pretrain_corpus(
    seed: int = 0, n_authors: int = 100, *, facts: Sequence[QAItem] | None = None, exclude: Iterable[QAItem] = ()
) -> list[QAItem]:
    """Question/answer pairs to pretrain a ``base`` model before it is fine-tuned on TOFU.

    - ``n_authors`` fictitious authors x 20 QA (varied phrasing), named from a surname pool that the
      synthetic TOFU authors never use, so no evaluated synthetic author appears here; names found
      (case-insensitively) in any text of ``exclude`` are skipped as well: pass the evaluated real
      splits (e.g. TOFU ``full`` + ``holdout10``) to keep the corpus disjoint from them too;
    - then every item of ``facts`` (default: the built-in real-authors and world-facts sets of
      :mod:`mmunlearn.data.facts`; pass TOFU's ``real_authors_perturbed`` + ``world_facts_perturbed``
      when evaluating on real TOFU) as question + answer.

    Items carry question and answer only, ``author`` None; the order is authors then facts
    (shuffle when training). Deterministic for a seed.
    """
    texts = [t for it in exclude for t in (it.question, it.answer, it.paraphrased_answer, it.paraphrased_question) if t]
    haystack = "\n".join(texts).lower()
    avoid = (lambda name: name.lower() in haystack) if haystack else None
    authors = synthetic_authors(n_authors, seed=seed, pool="pretrain", avoid=avoid)
    items = [QAItem(it.question, it.answer) for a in authors for it in author_items(a, seed=seed, pool="pretrain")]
    general = real_author_items(seed) + world_fact_items(seed) if facts is None else list(facts)
    return items + [QAItem(it.question, it.answer) for it in general]
