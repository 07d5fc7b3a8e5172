"""Paraphrase and language attack: the forget measures when the forget questions are asked differently.

An output-level filter or a method that only learnt to dodge the benchmark's wording lets the same fact out
under another wording (Lynch et al. 2024 list rephrased and translated prompts among their eight tests).
TOFU ships a ``paraphrased_question`` for every ``forgetPP_perturbed`` row (read by
:mod:`mmunlearn.data.tofu`); cTOFU has every forget row in every language (:mod:`mmunlearn.data.ctofu.worlds`), so
the same measures are taken per language. For a speaker classifier the analogue is other recordings of the
forgotten speakers (held-out sessions the model never trained on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def paraphrased(items: Sequence[Any]) -> list[Any]:
    """The items with their question replaced by ``paraphrased_question`` (answers and other fields kept);
    a ValueError when an item has none (the audit needs them on every forget row)."""
    missing = [i for i, it in enumerate(items) if not getattr(it, "paraphrased_question", None)]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(items)} forget items have no paraphrased_question "
            f"(first: item {missing[0]}); the paraphrase audit needs TOFU's forgetPP_perturbed rows"
        )
    return [dataclasses.replace(it, question=it.paraphrased_question) for it in items]


def has_paraphrases(items: Sequence[Any]) -> bool:
    """Whether every item carries a ``paraphrased_question``."""
    return bool(items) and all(getattr(it, "paraphrased_question", None) for it in items)
