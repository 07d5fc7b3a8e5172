"""The TOFU rows a preset build uses: tokenizer texts, the pretraining corpus, the facts that model utility
needs, the training rows of a split and the forget rows whose memorisation a build checks."""

from __future__ import annotations

import logging
import os

from mmunlearn.data.corpus import pretrain_corpus
from mmunlearn.data.tofu import QAItem, TOFUFormatError, list_splits, load_split, split_info

log = logging.getLogger(__name__)
#: The data's real-authors and world-facts splits (pretrained on, rehearsed, and measured by model utility).
FACT_SPLITS = ("real_authors_perturbed", "world_facts_perturbed")


def _item_texts(item: QAItem) -> list[str]:
    return [
        t
        for t in (
            item.question,
            item.answer,
            item.paraphrased_answer,
            item.paraphrased_question,
            *item.perturbed_answer,
        )
        if t
    ]


def source_texts(data: str | os.PathLike) -> list[str]:
    """Every text field of every split of a TOFU source (splits that do not parse are skipped, logged)."""
    texts: list[str] = []
    for split in list_splits(data):
        try:
            items = load_split(data, split)
        except (TOFUFormatError, ValueError) as e:
            log.warning("tokenizer texts: skipping split %r of %s (%s)", split, data, e)
            continue
        texts.extend(t for it in items for t in _item_texts(it))
    if not texts:
        raise ValueError(f"no text found in the TOFU source {data!r}")
    return texts


def base_corpus(data: str | os.PathLike, n_authors: int, seed: int) -> list[QAItem]:
    """The pretraining corpus for ``data``: its real-authors and world-facts QA as facts (the built-in
    ones if it has none) and fictitious authors none of whose names occur in its author splits."""
    splits = set(list_splits(data))
    facts = [it for s in FACT_SPLITS for it in load_split(data, s)] if set(FACT_SPLITS) <= splits else None
    authored = [s for s in splits if s == "full" or split_info(s).family == "holdout"]
    exclude = [it for s in sorted(authored) for it in load_split(data, s)]
    return pretrain_corpus(seed, n_authors=n_authors, facts=facts, exclude=exclude)


def fact_items(data: str | os.PathLike) -> list[QAItem]:
    """The data's real-authors and world-facts QA (empty when it has none), to watch utility knowledge."""
    splits = set(list_splits(data))
    return [it for s in FACT_SPLITS if s in splits for it in load_split(data, s)]


def training_items(data: str | os.PathLike, split: str, authors: int | None, forget_pct: float | None) -> list[QAItem]:
    """Rows of ``split`` (an author subset of ``authors`` authors when given) as question/answer items."""
    items = load_split(data, split, authors=authors, forget_pct=forget_pct)
    return [QAItem(it.question, it.answer, author=it.author) for it in items]


def forget_rows(data: str | os.PathLike, split: str, authors: int | None, forget_pct: float) -> list[QAItem]:
    """The rows of forget authors in training split ``split``: all of a forget split, the
    ``forget<forget_pct>`` rows of ``full``, none of any other split (retain, holdout, ...)."""
    if split == "full":
        name = f"forget{int(forget_pct):02d}"
        if int(forget_pct) != forget_pct or name not in list_splits(data):
            log.warning("no %s split in %s: the forget rows of 'full' are not scored", name, data)
            return []
        return training_items(data, name, authors, forget_pct)
    info = split_info(split)
    if info.family == "forget" and not split.endswith("_perturbed"):
        return training_items(data, split, authors, forget_pct)
    return []
