"""ROUGE of generated answers against reference answers (rouge_score, Porter stemming).

As in open-unlearning's TOFU evaluator (``eval_text_similarity``): one ``RougeScorer(["rouge1",
"rougeL"], use_stemmer=True)``, ``score(target=reference, prediction=generation)``, and three
numbers per item: ``rouge1_recall``, ``rougeL_f1`` and ``rougeL_recall``. The TOFU ``*_ROUGE``
aggregates are the mean ``rougeL_recall``. Generations are scored as given: the caller strips
them and cuts them at the stop strings / EOS (the reference does so before scoring).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from mmunlearn.metrics import _checks

ROUGE_FIELDS: tuple[str, ...] = ("rouge1_recall", "rougeL_f1", "rougeL_recall")


@lru_cache(maxsize=1)
def _scorer() -> Any:
    """The shared scorer; rouge_score (and nltk under it, ~1.5 s) is imported on first use only."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge_scores(generations: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-item ROUGE numbers: ``{field: (N,) array}`` for each field in ``ROUGE_FIELDS``.

    generations: N generated answers (already stripped / cut at stop strings).
    references: N reference answers (the dataset's ``answer``).
    """
    gens = _checks.strings(generations, "generations")
    refs = _checks.strings(references, "references")
    n = _checks.same_length(generations=gens, references=refs)
    out = {field: np.empty(n) for field in ROUGE_FIELDS}
    scorer = _scorer()
    for i, (gen, ref) in enumerate(zip(gens, refs)):
        s = scorer.score(ref, gen)
        out["rouge1_recall"][i] = s["rouge1"].recall
        out["rougeL_f1"][i] = s["rougeL"].fmeasure
        out["rougeL_recall"][i] = s["rougeL"].recall
    return out


def rouge_l_recall(generations: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Per-item ROUGE-L recall of each generation against its reference, shape ``(N,)``."""
    return rouge_scores(generations, references)["rougeL_recall"]
