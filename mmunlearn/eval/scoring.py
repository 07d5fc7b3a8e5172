"""Teacher-forced scoring pass: per-item answer NLL and the per-token statistics the TOFU metrics need.

One forward per batch through ``adapter.logits(batch)`` (``B x T-1 x V`` next-token logits aligned
with their targets, ``-100`` off the answer). Because only ``log_softmax`` of those logits is used,
a model whose forward already returns normalised log-probs (e.g. a tilted model) is scored
unchanged: ``log_softmax`` of log-probs is the identity.

Per item, as open-unlearning's TOFU evaluator computes them (``src/evals/metrics/utils.py``):

* ``avg_nll``: mean over *all* labelled tokens (answer + EOS) of ``-log p`` (``evaluate_probability``:
  prob, truth ratio, the LOSS and zlib attacks).
* per-token statistics over the labelled tokens *without the trailing EOS* (the reference's
  ``tokenwise_logprobs`` / ``tokenwise_vocab_logprobs`` drop the last labelled position to "ignore
  eos prediction"; here it is dropped when it is the adapter's EOS id, which it always is for
  adapters that append EOS, so the positions agree): the target's log-prob (min-k), the mean and
  std of ``log p(v)`` under p over the vocabulary (min-k++, ``vocab_logprob_moments``) and
  ``argmax == target`` (exact memorisation, extraction strength).
* ``target_text``: the labelled ids decoded with special tokens skipped (the reference's
  ``extract_target_texts_from_processed_data``, the text the zlib attack compresses).

Items are batched in order of decreasing text length (less padding) and results returned in input
order. The ``V``-wide work is done per item on its answer positions only and reduced right away,
so memory beyond the model's own logits stays ``O(T_answer x V)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mmunlearn.metrics.mia import vocab_logprob_moments
from mmunlearn.progress import StageBar


@dataclass
class Scores:
    """Per-item results of :func:`score_answers`, in input order.

    ``avg_nll`` is ``(N,)`` float64. The per-token lists (one ``(T_i,)`` array per item) are filled
    only when the pass was run with ``token_stats=True``.
    """

    avg_nll: np.ndarray
    token_logprobs: list[np.ndarray] = field(default_factory=list)
    mu: list[np.ndarray] = field(default_factory=list)
    sigma: list[np.ndarray] = field(default_factory=list)
    matches: list[np.ndarray] = field(default_factory=list)
    target_text: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.avg_nll)


def _question(item: Any) -> str:
    q = item.get("question") if isinstance(item, dict) else getattr(item, "question", None)
    return q if isinstance(q, str) else ""


def _length_order(items: Sequence[Any], answers: Sequence[str] | None) -> list[int]:
    """Indices sorted by decreasing character length of question + answer (a cheap token-count proxy)."""

    def size(i: int) -> int:
        item = items[i]
        a = (
            answers[i]
            if answers is not None
            else (item.get("answer") if isinstance(item, dict) else getattr(item, "answer", ""))
        )
        return len(_question(item)) + len(a or "")

    return sorted(range(len(items)), key=lambda i: -size(i))


def _decode(tokenizer: Any, ids: torch.Tensor) -> str:
    if tokenizer is None:
        return ""
    return tokenizer.decode(ids.tolist(), skip_special_tokens=True)


def _answer_rows(adapter: Any, batch: dict, idx: Sequence[int]):
    """``(row, item index, T_i x V logits, T_i targets)`` per row of ``batch``, from the adapter's ``answer_logits``
    (:class:`~mmunlearn.adapters.base.TokenAdapter`: the output projection on answer positions only)."""
    logits, targets, rows = adapter.answer_logits(batch)
    per_row = [(logits[rows == r], targets[rows == r]) for r in range(len(idx))]
    for r, (i, (row_logits, tgt)) in enumerate(zip(idx, per_row)):
        if tgt.numel() == 0:
            raise ValueError(f"item {i}: no answer tokens to score (prompt fills the length limit?)")
        yield r, i, row_logits, tgt


@torch.no_grad()
def score_answers(
    adapter: Any,
    items: Sequence[Any],
    answers: Sequence[str] | None = None,
    *,
    batch_size: int = 16,
    token_stats: bool = False,
    desc: str | None = None,
) -> Scores:
    """Score each item's answer (or ``answers[i]`` instead) teacher-forced; see the module docstring.

    adapter: a :class:`~mmunlearn.adapters.base.TokenAdapter`: ``collate(examples, answers=...)``,
        ``answer_logits(batch)``, ``tokenizer`` (``target_text``) and ``eos_id``.
    items: QA records (``QAItem`` or dicts with question/answer).
    token_stats: also compute the per-token statistics (min-k, min-k++, memorisation inputs).
    desc: progress-bar label (no bar when None).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(items)
    if n == 0:
        raise ValueError("score_answers: no items to score")
    if answers is not None and len(answers) != n:
        raise ValueError(f"score_answers: {len(answers)} answers for {n} items")
    eos_id, tokenizer = adapter.eos_id, adapter.tokenizer
    order = _length_order(items, answers)
    avg_nll = np.empty(n, dtype=np.float64)
    per_token: dict[str, list[Any]] = {k: [None] * n for k in ("lp", "mu", "sigma", "match", "text")}

    bar = StageBar(total=n, desc=desc, disable=desc is None, leave=False, unit="item")
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        sub_answers = [answers[i] for i in idx] if answers is not None else None
        for _row, i, row_logits, tgt in _answer_rows(
            adapter, adapter.collate([items[i] for i in idx], sub_answers), idx
        ):
            n_tok = tgt.numel()
            lp = torch.log_softmax(row_logits.float(), dim=-1)  # T_i x V
            tok_lp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            avg_nll[i] = float(-tok_lp.double().sum() / n_tok)
            if not token_stats:
                continue
            keep = n_tok - 1 if (n_tok > 1 and eos_id is not None and int(tgt[-1]) == eos_id) else n_tok
            # float64 here: sigma_t comes from E[(log p)^2] - mu_t^2, which cancels badly in float32
            # for flat distributions (sigma ~ 0.1 next to |log p| ~ 6).
            mu, sigma = vocab_logprob_moments(torch.log_softmax(row_logits[:keep].double(), dim=-1))
            per_token["lp"][i] = tok_lp[:keep].double().cpu().numpy()
            per_token["mu"][i], per_token["sigma"][i] = mu, sigma
            per_token["match"][i] = (lp[:keep].argmax(-1) == tgt[:keep]).cpu().numpy()
            per_token["text"][i] = _decode(tokenizer, tgt.cpu())
        bar.update(len(idx))
    bar.close()
    if not token_stats:
        return Scores(avg_nll)
    return Scores(avg_nll, per_token["lp"], per_token["mu"], per_token["sigma"], per_token["match"], per_token["text"])


def score_candidates(
    adapter: Any,
    items: Sequence[Any],
    candidates: Sequence[Sequence[str]],
    *,
    batch_size: int = 16,
    desc: str | None = None,
    what: str = "candidates",
) -> np.ndarray:
    """Average NLL of K alternative answers per item, ``(N, K)`` (flattened, batched, reshaped).

    candidates: per item a sequence of K answer strings (e.g. ``perturbed_answer``); every item must
    have the same K (the TOFU metrics average over a rectangular ``(N, K)``). ``what`` names the
    field in error messages.
    """
    if len(candidates) != len(items):
        raise ValueError(f"{what}: {len(candidates)} candidate lists for {len(items)} items")
    counts = {len(c) for c in candidates}
    if len(counts) != 1 or 0 in counts:
        bad = next(i for i, c in enumerate(candidates) if len(c) != len(candidates[0]) or not c)
        raise ValueError(
            f"{what}: every item needs the same non-zero number of candidates; item 0 has "
            f"{len(candidates[0])}, item {bad} has {len(candidates[bad])}"
        )
    k = counts.pop()
    flat_items = [item for item in items for _ in range(k)]
    flat_answers = [a for c in candidates for a in c]
    scores = score_answers(adapter, flat_items, flat_answers, batch_size=batch_size, desc=desc)
    return scores.avg_nll.reshape(len(items), k)


#: ``max_new_tokens="auto"``: a batch generates as many tokens as its longest gold answer has, plus this margin
#: (ROUGE-L recall is measured against the gold answer, so tokens far past its length rarely change it; the
#: reference's fixed 200 stays available as a number).
AUTO_MARGIN = 16


def gold_token_counts(adapter: Any, answers: Sequence[str]) -> list[int]:
    """Tokens of each gold answer under the adapter's tokenizer (special tokens not added)."""
    tok = adapter.tokenizer
    if tok is None:
        raise ValueError("max_new_tokens='auto' needs an adapter with a tokenizer")
    return [len(tok(a, add_special_tokens=False)["input_ids"]) for a in answers]


def generate_answers(
    adapter: Any,
    questions: Sequence[str],
    *,
    max_new_tokens: int | str,
    batch_size: int = 16,
    desc: str | None = None,
    gold: Sequence[str] | None = None,
    cap: int = 200,
) -> list[str]:
    """Greedy generations (stripped, special tokens removed) in input order.

    Questions are batched in order of decreasing length (less left padding) through
    ``adapter.generate``; batched greedy decoding equals one-by-one (checked in the adapter tests).
    ``max_new_tokens``: a number, or ``"auto"``: per batch, the longest of its ``gold`` answers in
    tokens plus :data:`AUTO_MARGIN`, at most ``cap``. Generation stops early once every row has ended.
    """
    if max_new_tokens == "auto":
        if gold is None or len(gold) != len(questions):
            raise ValueError("max_new_tokens='auto' needs one gold answer per question")
        limits = [min(cap, n + AUTO_MARGIN) for n in gold_token_counts(adapter, gold)]
    elif isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 1:
        limits = [max_new_tokens] * len(questions)
    else:
        raise ValueError(f"max_new_tokens must be a positive integer or 'auto', got {max_new_tokens!r}")
    order = sorted(range(len(questions)), key=lambda i: -len(questions[i]))
    out: list[str] = [""] * len(questions)
    bar = StageBar(total=len(questions), desc=desc, disable=desc is None, leave=False, unit="item")
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        texts = adapter.generate(
            [questions[i] for i in idx], max_new_tokens=max(limits[i] for i in idx), batch_size=len(idx)
        )
        for i, text in zip(idx, texts):
            out[i] = text.strip()
        bar.update(len(idx))
    bar.close()
    return out
