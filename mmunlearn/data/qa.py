"""The TOFU schema shared by the readers and the built-in generator: QA records, split names, forget sizes."""

from __future__ import annotations

from dataclasses import dataclass

QA_PER_AUTHOR = 20
TOFU_SPLITS: tuple[str, ...] = (
    "full",
    "retain90",
    "retain95",
    "retain99",
    "forget01",
    "forget05",
    "forget10",
    "forget01_perturbed",
    "forget05_perturbed",
    "forget10_perturbed",
    "retain_perturbed",
    "real_authors",
    "real_authors_perturbed",
    "world_facts",
    "world_facts_perturbed",
    "holdout01",
    "holdout05",
    "holdout10",
)


class TOFUFormatError(ValueError):
    """A split file (or hub table) that is not a list of records with the expected fields."""


@dataclass(frozen=True)
class QAItem:
    """One TOFU question. Fields beyond question/answer are filled only by the splits that have them."""

    question: str
    answer: str
    paraphrased_answer: str | None = None
    perturbed_answer: tuple[str, ...] = ()
    paraphrased_question: str | None = None
    author: int | None = None  # index in `full` order; holdout authors follow the last one

    def to_dict(self) -> dict[str, object]:
        """The TOFU JSON schema of this record (absent fields left out, perturbed answers as a list)."""
        out: dict[str, object] = {"question": self.question, "answer": self.answer}
        if self.paraphrased_answer is not None:
            out["paraphrased_answer"] = self.paraphrased_answer
        if self.perturbed_answer:
            out["perturbed_answer"] = list(self.perturbed_answer)
        if self.paraphrased_question is not None:
            out["paraphrased_question"] = self.paraphrased_question
        return out


def forget_count(n_authors: int, forget_pct: float) -> int:
    """Forget authors in a world of ``n_authors``: round-half-up(n_authors * pct / 100), at least 1.

    Python's ``round`` rounds halves to even; this integer form keeps 2.5 -> 3 and avoids float error.
    """
    if n_authors < 2:
        raise ValueError(f"need at least 2 authors (one retain, one forget), got {n_authors}")
    if not 0 < forget_pct < 100:
        raise ValueError(f"forget percentage must be in (0, 100), got {forget_pct}")
    n_forget = max(1, int((2 * n_authors * forget_pct + 100) // 200))
    if n_forget >= n_authors:
        raise ValueError(f"{forget_pct}% of {n_authors} authors leaves no retain author")
    return n_forget
