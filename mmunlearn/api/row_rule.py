"""The text-LLM rule judged row by row: "rule met" means no forget answer still comes out.

:class:`RowRule` is the :class:`~mmunlearn.methods.rule.SweepRule` ``mmunlearn.unlearn`` gives a text LLM
(:func:`mmunlearn.api.rules.text_rule`). Its forget measure, :class:`ForgetRows`, is the share of forget rows gone:

* every forget row's answer NLL at least its level (the reference model's NLL on that row; without a reference the
  row's own NLL before the edit + a rise, a guess the verdict names; or a level the user gives);
* once every row is at its level (and only then: the sweep stays cheap), the greedy answers to the forget questions
  are checked for the forget answers (:func:`says`: the row's ``key`` span when it has one, else ROUGE-L recall of
  the answer's words the question does not contain, at least :data:`SAID_RECALL`). A row the reference model says
  too (knowledge a model that never saw the row has) is not counted.

Paraphrased questions (a row's ``paraphrases``) are checked the same way: a row is out when its question or any
paraphrase gives it. The retain side keeps the NLL bound on held-out retain rows and adds, when the run is judged
(:meth:`RowRule.judge`), greedy agreement with the original: of the held-out retain answers the original says, at
least :data:`RETAIN_KEPT` must still be said. The verdict says how many forget rows still come out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mmunlearn.methods.rule import SweepRule, measure_label

#: ROUGE-L recall (of the answer's words the question does not contain) at or above which a greedy answer says it.
SAID_RECALL = 0.5
#: Of the held-out retain answers the original model says, the share the edited model must still say.
RETAIN_KEPT = 0.9
#: Longest greedy answer generated for a check (tokens); shorter when the answers are short.
MAX_NEW_TOKENS = 64


@lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge_score import rouge_scorer  # deferred: rouge_score pulls nltk (~1.5 s) in

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def distinctive(question: str, answer: str) -> str:
    """The answer's words (rouge_score's tokens, stemmed) that the question does not contain, in order; the whole
    answer when every word is in the question."""
    tok = _rouge()._tokenizer
    asked = set(tok.tokenize(question))
    words = tok.tokenize(answer)
    kept = [w for w in words if w not in asked]
    return " ".join(kept or words)


def says(row: Mapping[str, Any], generated: str, question: str | None = None) -> bool:
    """Whether the greedy answer ``generated`` (to ``question``, default the row's) gives the row's answer: its
    ``key`` span appears in it (case and punctuation ignored), or without a key the ROUGE-L recall of the answer's
    distinctive words (:func:`distinctive`) is at least :data:`SAID_RECALL`."""
    key = row.get("key")
    if isinstance(key, str) and key.strip():
        return f" {_norm(key)} " in f" {_norm(generated)} "
    target = distinctive(row["question"] if question is None else question, row["answer"])
    return _rouge().score(target, generated)["rougeL"].recall >= SAID_RECALL


def check_rule() -> str:
    """How a greedy answer is checked, in words (the verdict and the report name it)."""
    return (
        f"key span in the greedy answer, else ROUGE-L recall >= {SAID_RECALL:g} of the answer's words the "
        "question does not contain"
    )


def _questions(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(row index, question) for every row's question and paraphrases (a prompt-less row's question is "")."""
    out = []
    for i, r in enumerate(rows):
        out.append((i, r["question"]))
        out.extend((i, p) for p in r.get("paraphrases") or ())
    return out


def _max_new_tokens(adapter, rows: Sequence[Mapping[str, Any]]) -> int:
    longest = max((len(adapter.tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) for r in rows), default=0)
    return min(MAX_NEW_TOKENS, longest + 8)


def said_rows(adapter, rows: Sequence[Mapping[str, Any]]) -> set[int]:
    """Indices of ``rows`` whose answer a greedy answer to their question or to one of their paraphrases gives."""
    asked = [(i, q) for i, q in _questions(rows) if q]  # a prompt-less text has no question to ask
    if not asked:
        return set()
    answers = adapter.generate([q for _, q in asked], max_new_tokens=_max_new_tokens(adapter, rows))
    return {i for (i, q), text in zip(asked, answers) if says(rows[i], text, q)}


def row_nlls(adapter, rows: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """Per row: the answer NLL under its question, then under each paraphrase."""
    asked = _questions(rows)
    items = [{"question": q, "answer": rows[i]["answer"]} for i, q in asked]
    values = adapter.answer_nll(items).tolist()
    out: list[list[float]] = [[] for _ in rows]
    for (i, _), v in zip(asked, values):
        out[i].append(float(v))
    return out


@dataclass
class ForgetRows:
    """The forget measure of :class:`RowRule`: the share of forget rows gone (see the module docstring). ``levels``:
    per row, the NLL each of its questions (the question, then its paraphrases) must reach; ``reference_says``: rows
    the reference model says too (not counted). ``last`` holds the details of the latest call."""

    rows: list[dict[str, Any]]
    levels: list[list[float]]
    reference_says: set[int] = field(default_factory=set)
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def __name__(self) -> str:  # the name the rule reports (rule.measure_name)
        return "forget_rows_gone"

    def subset(self, items: Sequence[Any]) -> list[int]:
        """The indices of ``items`` among the rows (all of them when ``items`` are the rows; a batch's single set when
        a request is also applied one set at a time); a row the rule was not set up for is an error."""
        if len(items) == len(self.rows):
            return list(range(len(self.rows)))
        where = {(r["question"], r["answer"]): i for i, r in enumerate(self.rows)}
        keys = [(dict(it).get("question"), dict(it).get("answer")) for it in items]
        missing = [k for k in keys if k not in where]
        if missing:
            raise ValueError(f"the forget measure was not set up for the row {missing[0]!r:.120}")
        return [where[k] for k in keys]

    def details(self, adapter, *, greedy: bool, items: Sequence[Any] | None = None) -> dict[str, Any]:
        """Rows below their level and, when ``greedy`` (or none is below), rows a greedy answer still gives (of
        ``items``, default every row; indices are the rows' own)."""
        idx = self.subset(items) if items is not None else list(range(len(self.rows)))
        rows, levels = [self.rows[i] for i in idx], [self.levels[i] for i in idx]
        nlls = row_nlls(adapter, rows)
        below = sorted(idx[j] for j, (vs, ls) in enumerate(zip(nlls, levels)) if any(v < lv for v, lv in zip(vs, ls)))
        said = None
        if greedy or not below:
            said = sorted({idx[j] for j in said_rows(adapter, rows)} - self.reference_says)
        out = sorted({*below, *(said or ())})
        self.last = {
            "rows": len(rows),
            "below_level": below,
            "said": said,
            "out": out,
            "reference_says": sorted(self.reference_says),
            "min_gap": min(v - lv for vs, ls in zip(nlls, levels) for v, lv in zip(vs, ls)),
        }
        return self.last

    def __call__(self, adapter, items: Sequence[Any]) -> float:
        return 1.0 - len(self.details(adapter, greedy=False, items=items)["out"]) / len(items)


@dataclass
class RowRule(SweepRule):
    """A :class:`SweepRule` whose forget measure is a :class:`ForgetRows` (target 1: every row gone) and whose
    judgement adds greedy agreement on held-out retain rows (``retain_said``: the held-out rows the original says)."""

    retain_said: list[dict[str, Any]] = field(default_factory=list)
    target_note: str = ""
    mean_level: float = 0.0  # the mean of the rows' levels (the "nothing to forget" check compares the mean NLL)

    def judge(self, adapter, forget: Sequence[Any]) -> dict[str, Any]:
        """Everything the verdict needs about ``adapter``: the forget rows still out (greedy checked always) and the
        share of the original's held-out retain answers it still says."""
        rows = self.forget_measure.details(adapter, greedy=True, items=forget)  # type: ignore[attr-defined]
        kept = len(said_rows(adapter, self.retain_said)) / len(self.retain_said) if self.retain_said else None
        return {
            **rows,
            "check": check_rule(),
            "retain_checked": len(self.retain_said),
            "retain_kept": kept,
            "retain_kept_bound": RETAIN_KEPT,
            "met": not rows["out"] and (kept is None or kept >= RETAIN_KEPT),
        }

    def verdict(
        self, method: str, forget: float, retain_rise: float, met: bool, judged: Mapping[str, Any] | None = None
    ) -> str:
        if judged is None:
            return super().verdict(method, forget, retain_rise, met)
        head = f"rule met by {method}" if met else f"RULE NOT MET by {method}"
        n, said = judged["rows"], judged["said"] or []
        kept = judged["retain_kept"]
        agree = (
            f"{kept:.0%} of the {judged['retain_checked']} held-out retain answers the original says still said "
            f"(bound >= {RETAIN_KEPT:.0%})"
            if kept is not None
            else "greedy agreement not measured (the original says none of the held-out retain answers)"
        )
        return (
            f"{head}: forget set: {len(judged['out'])} of {n} rows still come out -- {len(said)} said by greedy "
            f"decoding ({judged['check']}), {len(judged['below_level'])} with an answer NLL below its level "
            f"({self.target_note}); retain set: {measure_label(self.retain_measure)} rose {retain_rise:+.4g} "
            f"(bound <= {self.retain_bound:.4g}), {agree}"
        )


__all__ = [
    "ForgetRows",
    "MAX_NEW_TOKENS",
    "RETAIN_KEPT",
    "RowRule",
    "SAID_RECALL",
    "check_rule",
    "distinctive",
    "row_nlls",
    "said_rows",
    "says",
]
