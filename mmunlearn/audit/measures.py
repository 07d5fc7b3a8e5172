"""What each audit measures before and after an attack: forget prob / ROUGE-L / forget quality of a text
model on QA items, forget-speaker accuracy of a speaker classifier; and the one ratio every attack reports.

All measures are "higher = the model still knows more" except ``forget_quality`` (a KS p-value against the
retain model: higher = closer to never having seen the data) and ``forget_nll`` (the mean answer / speaker
NLL: a finer reading than accuracy, which saturates), so every ratio below is written as a fraction
of a gap between two models and reads the same for both directions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmunlearn.eval.scoring import generate_answers, score_answers, score_candidates
from mmunlearn.eval.speaker import accuracy_of, score_rows
from mmunlearn.metrics import entries, tofu

#: Text measures, in table order.
TEXT_KEYS: tuple[str, ...] = ("forget_prob", "forget_rouge", "forget_quality", "forget_nll")
#: Speaker-classifier measures.
SPEAKER_KEYS: tuple[str, ...] = ("forget_acc", "forget_nll")
#: Measures of any other model family (speech LLMs): from teacher-forced answer NLLs only.
NLL_KEYS: tuple[str, ...] = ("forget_prob", "forget_nll")
#: Gaps smaller than this are treated as "no gap" (the ratio is undefined and reported as None).
MIN_GAP = 1e-6


def text_measures(
    adapter: Any,
    items: Sequence[Any],
    *,
    retain_truth_ratios: np.ndarray | None = None,
    max_new_tokens: int = 64,
    batch_size: int = 16,
    desc: str | None = None,
) -> tuple[dict[str, float | None], np.ndarray | None]:
    """Forget prob (mean p(answer | question)^(1/len), as TOFU's ``forget_Q_A_Prob``), forget ROUGE-L
    recall of the greedy answer, and forget quality (KS p-value of the truth ratios against
    ``retain_truth_ratios``; None without them or without paraphrased/perturbed answers on the items).

    Returns the measures and this model's per-item truth ratios (None when the items lack the fields).
    """
    if not items:
        raise ValueError("text_measures: no items to measure")
    avg_nll = score_answers(adapter, items, batch_size=batch_size, desc=desc and f"{desc}: prob").avg_nll
    questions = [it.question for it in items]
    gens = generate_answers(
        adapter, questions, max_new_tokens=max_new_tokens, batch_size=batch_size, desc=desc and f"{desc}: generate"
    )
    rouge = entries.rouge_entry(gens, [it.answer.strip() for it in items], questions)["agg_value"]
    out: dict[str, float | None] = {
        "forget_prob": float(np.exp(-avg_nll).mean()),
        "forget_rouge": float(rouge),
        "forget_quality": None,
        "forget_nll": float(avg_nll.mean()),
    }
    ratios = None
    if (
        all(getattr(it, "paraphrased_answer", None) and getattr(it, "perturbed_answer", None) for it in items)
        and len({len(it.perturbed_answer) for it in items}) == 1
    ):
        para = score_answers(adapter, items, [it.paraphrased_answer for it in items], batch_size=batch_size).avg_nll
        pert = score_candidates(adapter, items, [it.perturbed_answer for it in items], batch_size=batch_size)
        ratios = entries.per_item(entries.truth_ratio_entry(para, pert, "closer_to_1_better"))
        if retain_truth_ratios is not None:
            out["forget_quality"] = tofu.forget_quality(ratios, retain_truth_ratios)
    return out, ratios


def speaker_measures(
    adapter: Any, rows: Sequence[Mapping[str, Any]], *, batch_size: int = 16, desc: str | None = None
) -> dict[str, float]:
    """Identification accuracy on ``rows`` (the forget speakers' utterances; 1.0 = every one still recognised)
    and their mean NLL -log p(speaker | utterance)."""
    if not rows:
        raise ValueError("speaker_measures: no rows to measure")
    scores = score_rows(adapter, rows, batch_size=batch_size, desc=desc)
    return {"forget_acc": accuracy_of(scores), "forget_nll": float(np.nanmean(scores.nll))}


def nll_measures(
    adapter: Any, items: Sequence[Any], *, batch_size: int = 16, desc: str | None = None
) -> dict[str, float]:
    """Forget prob (mean exp(-answer NLL per token)) and mean answer NLL of any adapter with ``answer_nll``
    (a speech LLM's spoken-QA examples, a text LLM's QA items)."""
    if not items:
        raise ValueError("nll_measures: no items to measure")
    nll = adapter.answer_nll(list(items), batch_size=batch_size, desc=desc).double().numpy()
    return {"forget_prob": float(np.exp(-nll).mean()), "forget_nll": float(nll.mean())}


def kept(target: float | None, model: float | None, retain: float | None) -> float | None:
    """Forgetting kept relative to retraining: ``(target - model) / (target - retain)``.

    1.0: the model is as far from the target as the retain model is (as if retrained); 0.0: it is back at
    the target's level (everything recovered); None when a value is missing or target and retain agree.
    The three values are measured under the same attack (e.g. each model relearned with the same budget).
    """
    if target is None or model is None or retain is None or abs(target - retain) < MIN_GAP:
        return None
    return float((target - model) / (target - retain))


#: A model whose own gap to the target is below this share of the retain model's gap forgot next to nothing: the share
#: of that gap an attack closes is noise over a near-zero denominator, reported as not applicable (None).
NEGLIGIBLE_GAP = 0.1


def recovered(
    before: float | None, after: float | None, target: float | None, retain: float | None = None
) -> float | None:
    """Fraction of a model's own forgotten gap an attack closed: ``(after - before) / (target - before)``
    (0: nothing came back, 1: back at the target's level). None (not applicable) when there was no gap to close:
    below :data:`MIN_GAP`, or, given the ``retain`` model's value, below :data:`NEGLIGIBLE_GAP` of its gap."""
    if before is None or after is None or target is None or abs(target - before) < MIN_GAP:
        return None
    if retain is not None and abs(target - before) < NEGLIGIBLE_GAP * abs(target - retain):
        return None
    return float((after - before) / (target - before))
