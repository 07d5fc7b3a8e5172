"""ROUGE of generated answers against reference answers (rouge_score, Porter stemming).

As in open-unlearning's TOFU evaluator (``eval_text_similarity``): one ``RougeScorer(["rouge1",
"rougeL"], use_stemmer=True)``, ``score(target=reference, prediction=generation)``, and three
numbers per item: ``rouge1_recall``, ``rougeL_f1`` and ``rougeL_recall``. The TOFU ``*_ROUGE``
aggregates are the mean ``rougeL_recall``. Generations are scored as given: the caller strips
them and cuts them at the stop strings / EOS (the reference does so before scoring).

rouge_score's tokenizer keeps only ``[a-z0-9]``, so a reference in Arabic, Hindi or Japanese has no
tokens and every score is 0. An item whose reference contains a letter of a non-Latin script is
therefore scored with :func:`script_tokens` (no stemming); Latin-script items (English TOFU) keep the
reference tokenizer, so English numbers are unchanged.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

import mmunlearn.metrics._checks as _checks

ROUGE_FIELDS: tuple[str, ...] = ("rouge1_recall", "rougeL_f1", "rougeL_recall")


@lru_cache(maxsize=2)
def _scorer(multilingual: bool = False) -> Any:
    """The shared scorers; rouge_score (and nltk under it, ~1.5 s) is imported on first use only."""
    from rouge_score import rouge_scorer

    if multilingual:
        return rouge_scorer.RougeScorer(["rouge1", "rougeL"], tokenizer=_ScriptTokenizer())
    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


# Scripts written without spaces between words: each character is a token (the usual choice for
# character-level ROUGE on Chinese/Japanese). Hand-written because rouge_score offers no multilingual
# tokenizer and none of the installed libraries provides one for these scripts.
_CHAR_SCRIPTS = ("CJK UNIFIED", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER")


def _char_token(ch: str) -> bool:
    name = unicodedata.name(ch, "")
    return any(name.startswith(script) for script in _CHAR_SCRIPTS)


def script_tokens(text: str) -> list[str]:
    """Lower-cased word tokens of any script: runs of letters, digits and combining marks (so Devanagari
    vowel signs stay inside their word); CJK ideographs and kana are one token each; punctuation,
    symbols and spaces separate.

    >>> script_tokens("Jaime Vásquez, 1958")
    ['jaime', 'vásquez', '1958']
    >>> script_tokens("著者はハイメです。")
    ['著', '者', 'は', 'ハ', 'イ', 'メ', 'で', 'す']
    """
    tokens: list[str] = []
    word: list[str] = []
    for ch in text.casefold():
        if _char_token(ch):
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif unicodedata.category(ch)[0] in "LMN":
            word.append(ch)
        elif word:
            tokens.append("".join(word))
            word = []
    if word:
        tokens.append("".join(word))
    return tokens


class _ScriptTokenizer:
    """The ``tokenize`` interface rouge_score expects, over :func:`script_tokens`."""

    def tokenize(self, text: str) -> list[str]:
        return script_tokens(text)


def non_latin(text: str) -> bool:
    """Whether ``text`` has a letter outside the Latin script (then it is scored with script_tokens)."""
    return any(
        unicodedata.category(ch)[0] == "L" and not unicodedata.name(ch, "LATIN").startswith("LATIN") for ch in text
    )


def rouge_scores(generations: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-item ROUGE numbers: ``{field: (N,) array}`` for each field in ``ROUGE_FIELDS``.

    generations: N generated answers (already stripped / cut at stop strings).
    references: N reference answers (the dataset's ``answer``).
    """
    gens = _checks.strings(generations, "generations")
    refs = _checks.strings(references, "references")
    n = _checks.same_length(generations=gens, references=refs)
    out = {field: np.empty(n) for field in ROUGE_FIELDS}
    for i, (gen, ref) in enumerate(zip(gens, refs)):
        s = _scorer(non_latin(ref)).score(ref, gen)
        out["rouge1_recall"][i] = s["rouge1"].recall
        out["rougeL_f1"][i] = s["rougeL"].fmeasure
        out["rougeL_recall"][i] = s["rougeL"].recall
    return out


def rouge_l_recall(generations: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Per-item ROUGE-L recall of each generation against its reference, shape ``(N,)``."""
    return rouge_scores(generations, references)["rougeL_recall"]
