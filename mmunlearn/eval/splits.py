"""The TOFU splits one evaluation reads, loaded up front with clear errors for missing or unusable ones.

Which split feeds which metric (open-unlearning ``configs/eval/tofu.yaml`` and
``configs/eval/tofu_metrics/*.yaml``; ``forgetPP`` is the ``forget_split`` argument):

==============================  =================================================================
split                           metrics
==============================  =================================================================
``forgetPP_perturbed``          forget_Q_A_{Prob,PARA_Prob,PERT_Prob,ROUGE}, forget_truth_ratio,
                                forget_quality, extraction_strength, exact_memorization, and the
                                members of every mia_* attack
``holdoutPP``                   the non-members of every mia_* attack (``holdout_split``)
``retain_perturbed``            retain_Q_A_{Prob,PARA_Prob,PERT_Prob,ROUGE}, retain_Truth_Ratio
``real_authors_perturbed``      ra_Q_A_{Prob,PERT_Prob,Prob_normalised,ROUGE}, ra_Truth_Ratio
``world_facts_perturbed``       wf_Q_A_{Prob,PERT_Prob,Prob_normalised,ROUGE}, wf_Truth_Ratio
==============================  =================================================================

With ``authors`` every split goes through ``load_split(..., authors=N)`` (real authors and world
facts come back unchanged; forget, holdout and retain_perturbed shrink consistently).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmunlearn.data.tofu import QAItem, TOFUFormatError, load_split

_FORGET_RE = re.compile(r"forget(\d\d)")


class MissingSplitError(FileNotFoundError):
    """A split the evaluation needs is not in the data source."""


@dataclass(frozen=True)
class EvalSplits:
    """Loaded splits (None for the ones the chosen metric groups do not need) and their names."""

    forget_split: str
    holdout_split: str
    forget: list[QAItem] | None = None
    holdout: list[QAItem] | None = None
    retain: list[QAItem] | None = None
    real_authors: list[QAItem] | None = None
    world_facts: list[QAItem] | None = None

    def sizes(self) -> dict[str, int]:
        """Items per loaded split, keyed by the split's file name."""
        names = {
            "forget": f"{self.forget_split}_perturbed",
            "holdout": self.holdout_split,
            "retain": "retain_perturbed",
            "real_authors": "real_authors_perturbed",
            "world_facts": "world_facts_perturbed",
        }
        return {names[k]: len(v) for k, v in self.__dict__.items() if isinstance(v, list)}


def holdout_for(forget_split: str) -> str:
    """The holdout split matching a forget split: ``forget10`` -> ``holdout10``."""
    m = _FORGET_RE.fullmatch(forget_split) if isinstance(forget_split, str) else None
    if m is None:
        raise ValueError(f"forget_split must look like 'forget10' (forget01, forget05, ...), got {forget_split!r}")
    return f"holdout{m.group(1)}"


def _describe(source: Any) -> str:
    if isinstance(source, Mapping):
        return "the given mapping of splits"
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def _load(source: Any, split: str, authors: int | None, purpose: str) -> list[QAItem]:
    try:
        items = load_split(source, split, authors=authors)
    except (FileNotFoundError, KeyError) as e:
        detail = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise MissingSplitError(
            f"TOFU split {split!r} (needed for {purpose}) is missing from data source {_describe(source)}: {detail}"
        ) from e
    except TOFUFormatError as e:
        raise TOFUFormatError(f"TOFU split {split!r} (needed for {purpose}) in {_describe(source)}: {e}") from e
    if not items:
        raise ValueError(f"TOFU split {split!r} in {_describe(source)} is empty (needed for {purpose})")
    return items


def _require(items: Sequence[QAItem], split: str, fields: Collection[str], source: Any) -> None:
    """Every item has the fields (non-empty); perturbed answers equally many per item."""
    for i, it in enumerate(items):
        for f in fields:
            if not getattr(it, f, None):
                raise ValueError(
                    f"TOFU split {split!r} in {_describe(source)}: item {i} has no {f!r} "
                    f"(the evaluation needs {', '.join(fields)} on every item)"
                )
    if "perturbed_answer" in fields:
        k = len(items[0].perturbed_answer)
        bad = next((i for i, it in enumerate(items) if len(it.perturbed_answer) != k), None)
        if bad is not None:
            raise ValueError(
                f"TOFU split {split!r} in {_describe(source)}: item 0 has {k} perturbed answers, "
                f"item {bad} has {len(items[bad].perturbed_answer)}; the truth ratio needs the "
                f"same number for every item"
            )


def load_eval_splits(source: Any, forget_split: str, authors: int | None, groups: Collection[str]) -> EvalSplits:
    """Load every split the metric ``groups`` need (see ``mmunlearn.eval.tofu.METRIC_GROUPS``)."""
    holdout_split = holdout_for(forget_split)
    needs_forget = bool({"forget", "memorization", "mia"} & set(groups))
    loaded: dict[str, list[QAItem] | None] = {}
    perturbed = ("paraphrased_answer", "perturbed_answer")
    if needs_forget:
        name = f"{forget_split}_perturbed"
        loaded["forget"] = _load(source, name, authors, "the forget-set metrics")
        if "forget" in groups:
            _require(loaded["forget"], name, perturbed, source)
    if "mia" in groups:
        loaded["holdout"] = _load(source, holdout_split, authors, "the MIA non-members")
    if "utility" in groups:
        loaded["retain"] = _load(source, "retain_perturbed", authors, "retain_* and model_utility")
        _require(loaded["retain"], "retain_perturbed", perturbed, source)
        for key, name, prefix in (
            ("real_authors", "real_authors_perturbed", "ra"),
            ("world_facts", "world_facts_perturbed", "wf"),
        ):
            loaded[key] = _load(source, name, authors, f"{prefix}_* and model_utility")
            _require(loaded[key], name, ("perturbed_answer",), source)
    return EvalSplits(forget_split, holdout_split, **loaded)
