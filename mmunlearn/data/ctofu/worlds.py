"""Cross-lingual TOFU (cTOFU) worlds: the multilingual training and evaluation data of one run.

The languages' files are opened by :mod:`mmunlearn.data.ctofu.sources` (layout there; its names are
importable from here too).

A *world* (:func:`build_world`) fixes the languages, keeps every forget author and the first N
retain authors (``authors``), optionally the first K real-authors / world-facts rows per language
(``facts``), and gives the combined training data (``full`` = retain + forget of every language,
``retainRR``; what :func:`mmunlearn.presets.build.build_models` reads) and one TOFU data source per
language for :func:`mmunlearn.eval.evaluate_tofu`.

Trained text = scored text (issue 16). The metrics score the rows of ``forget01_perturbed`` (forget
probability, ROUGE-L, truth ratio) and ``retain_perturbed`` (retain metrics, model utility), while
the models train on ``forget01`` and ``retain99``. Row i of ``forget01_perturbed`` is row i of
``forget01``, and row i of ``retain_perturbed`` is row i of ``retain99`` (TOFU's first authors), but
the shipped translations were made separately per file: ``forget01_<lang>`` and
``forget01_perturbed_<lang>`` have no row with the same question and answer (0 of 40 in every
language; at most 6 questions and 1 answer match), and ``retain_perturbed`` differs from
``retain99`` in one row in hi and in ko. In English TOFU they are
identical. So a world trains (``train_text="scored"``, the default) on the scoring file's
question/answer wherever a row is scored: every forget row's text comes from
``<forget>_perturbed``, which also carries the paraphrased and perturbed answers the truth ratio
compares it with, and retain row i from ``retain_perturbed`` row i for the rows that file has (all of
them, whatever the world's size, so a row's text never depends on how many authors are kept); the
other retain rows come from ``retain99``. ``train_text="files"`` trains on ``forget01`` /
``retain99`` as shipped (the behaviour before issue 16; on the shipped translations the metrics then
score another wording than the model learned). :meth:`World.text_agreement` counts, per language
and split, the scored rows whose trained question and answer are identical to the scored ones, and
how many the two files already share; the recipe writes it to ``alignment.md`` and stops on a
mismatch unless told to go on. The real-authors / world-facts rows are one file, trained and scored
alike.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from mmunlearn.data.ctofu.sources import CTOFU, ENGLISH, LanguageFiles, open_ctofu, parse_langs, split_and_language
from mmunlearn.data.tofu import QA_PER_AUTHOR, QAItem, author_subset, forget_count, split_info

__all__ = [
    "CTOFU",
    "ENGLISH",
    "FACT_SPLITS",
    "FORGET_SPLIT",
    "RETAIN_SCORED",
    "TRAIN_TEXTS",
    "LanguageFiles",
    "SplitMapping",
    "TextAgreement",
    "World",
    "build_world",
    "open_ctofu",
    "parse_langs",
    "retain_split_for",
    "same_text",
    "split_and_language",
]

log = logging.getLogger(__name__)

FORGET_SPLIT = "forget01"  # the only forget split the shipped translations have
FACT_SPLITS = ("real_authors_perturbed", "world_facts_perturbed")
RETAIN_SCORED = "retain_perturbed"
#: where a world's training rows take their question/answer from (module docstring)
TRAIN_TEXTS = ("scored", "files")


class SplitMapping(dict):
    """A dict split -> records whose ``repr`` is a short name plus a content digest, so it can serve as
    a TOFU data source wherever the source's ``str`` names it (cache keys, logs)."""

    def __init__(self, name: str, splits: Mapping[str, Sequence[QAItem]]):
        super().__init__({k: list(v) for k, v in splits.items()})
        h = hashlib.sha256()
        for key in sorted(self):
            h.update(key.encode() + b"\0")
            for it in self[key]:
                h.update(json.dumps([it.to_dict(), it.author], ensure_ascii=False, sort_keys=True).encode())
        self.name = name
        self.digest = h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"{self.name}#{self.digest}"

    __str__ = __repr__


def _plain(items: Sequence[QAItem]) -> list[QAItem]:
    return [QAItem(it.question, it.answer, author=it.author) for it in items]


def same_text(a: QAItem, b: QAItem) -> bool:
    """Whether two rows have the identical question and answer (character for character)."""
    return a.question == b.question and a.answer == b.answer


@dataclass(frozen=True)
class TextAgreement:
    """Trained vs scored text of one language and split pair (:meth:`World.text_agreement`)."""

    lang: str
    split: str  # the training split (forget01, retain99)
    scored_split: str  # the split the metrics score (forget01_perturbed, retain_perturbed)
    scored: int  # rows scored
    shared: int  # scored rows trained on with the identical question and answer
    in_files: int | None  # scored rows whose question/answer the two files themselves share (None: unknown)
    differing_rows: tuple[int, ...] = ()  # the first scored rows that are not shared

    @property
    def ok(self) -> bool:
        return self.shared == self.scored


def _scored_text(trained: Sequence[QAItem], scored: Sequence[QAItem]) -> list[QAItem]:
    """``trained`` with row i's question/answer taken from ``scored`` row i (where it has one)."""
    return [
        QAItem(scored[i].question, scored[i].answer, author=it.author) if i < len(scored) else it
        for i, it in enumerate(trained)
    ]


def retain_split_for(forget_split: str) -> str:
    """The retain split matching a forget split: ``forget01`` -> ``retain99``."""
    info = split_info(forget_split)
    if info.family != "forget" or forget_split.endswith("_perturbed"):
        raise ValueError(f"forget_split must be a forget split such as 'forget01', got {forget_split!r}")
    return f"retain{100 - info.forget_pct:02d}"


@dataclass(frozen=True)
class World:
    """The data of one cross-lingual run (see the module docstring and :func:`build_world`)."""

    languages: tuple[str, ...]
    forget_split: str
    retain_split: str
    retain_authors: int  # retain authors kept (all forget authors are always kept)
    forget_authors: int
    facts: int | None
    forget: Mapping[str, list[QAItem]]  # question/answer rows per language
    retain: Mapping[str, list[QAItem]]
    eval_data: Mapping[str, SplitMapping]  # per language: what evaluate_tofu(..., forget_split) reads
    facts_language: Mapping[str, str]  # whose real-authors / world-facts rows each language's utility uses
    train_text: str = "scored"  # one of TRAIN_TEXTS (module docstring)
    # per language: training split -> scored rows whose question/answer the two shipped files share
    files_agree: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def scored_pairs(self) -> tuple[tuple[str, str], ...]:
        """(training split, split the metrics score) for every pair the world uses."""
        return (self.forget_split, f"{self.forget_split}_perturbed"), (self.retain_split, RETAIN_SCORED)

    def text_agreement(self) -> list[TextAgreement]:
        """Per language and pair of :meth:`scored_pairs`: how many scored rows the model is trained on
        with the identical question and answer (row i scored vs row i trained)."""
        out = []
        for lang in self.languages:
            trained_by_split = {self.forget_split: self.forget[lang], self.retain_split: self.retain[lang]}
            for split, scored_split in self.scored_pairs():
                trained, scored = trained_by_split[split], self.eval_data[lang][scored_split]
                differ = [i for i, it in enumerate(scored) if i >= len(trained) or not same_text(trained[i], it)]
                out.append(
                    TextAgreement(
                        lang,
                        split,
                        scored_split,
                        len(scored),
                        len(scored) - len(differ),
                        self.files_agree.get(lang, {}).get(split),
                        tuple(differ[:10]),
                    )
                )
        return out

    def items(self, kind: str, langs: Sequence[str]) -> list[QAItem]:
        """Forget or retain training rows of ``langs`` (in that order)."""
        table = {"forget": self.forget, "retain": self.retain}[kind]
        missing = [lang for lang in langs if lang not in table]
        if missing:
            raise KeyError(f"languages {missing} are not in this world ({', '.join(self.languages)})")
        return [it for lang in langs for it in table[lang]]

    @cached_property
    def training_data(self) -> SplitMapping:
        """Every language at once: ``full`` (retain then forget rows, language by language), the retain
        and forget splits, and the evaluation splits (so a tokenizer trained on it sees every text);
        the real-authors / world-facts rows (each facts language once) are the pretraining facts and
        the fine-tuning replay of the preset builder."""
        langs = self.languages
        splits = {
            "full": [it for lang in langs for it in self.retain[lang] + self.forget[lang]],
            self.retain_split: self.items("retain", langs),
            self.forget_split: self.items("forget", langs),
        }
        for key in (f"{self.forget_split}_perturbed", "retain_perturbed"):
            splits[key] = [it for lang in langs for it in self.eval_data[lang][key]]
        owners = {self.facts_language[lang]: lang for lang in reversed(langs)}  # one language per facts source
        for key in FACT_SPLITS:
            splits[key] = [
                it
                for fl in dict.fromkeys(self.facts_language[lang] for lang in langs)
                for it in self.eval_data[owners[fl]][key]
            ]
        return SplitMapping(f"ctofu[{','.join(langs)}|{self._tag()}]", splits)

    def _tag(self) -> str:
        return f"{self.forget_split}|r{self.retain_authors}|facts{self.facts if self.facts is not None else 'all'}"

    def describe(self) -> dict[str, Any]:
        return {
            "languages": list(self.languages),
            "forget_split": self.forget_split,
            "retain_split": self.retain_split,
            "retain_authors": self.retain_authors,
            "forget_authors": self.forget_authors,
            "facts_per_language": self.facts,
            "rows_per_language": {
                lang: {
                    "forget": len(self.forget[lang]),
                    "retain": len(self.retain[lang]),
                    **{k: len(v) for k, v in self.eval_data[lang].items()},
                }
                for lang in self.languages
            },
            "facts_language": dict(self.facts_language),
            "train_text": self.train_text,
            "text_agreement": [asdict(a) for a in self.text_agreement()],
        }


def _blocks(n_rows: int, what: str) -> int:
    if n_rows % QA_PER_AUTHOR:
        raise ValueError(f"{what}: {n_rows} rows are not whole authors of {QA_PER_AUTHOR} QA")
    return n_rows // QA_PER_AUTHOR


def _language_data(
    ct: CTOFU, lang: str, forget_split: str, retain_split: str, authors: int | None, train_text: str
) -> tuple[list, list, dict, str | None, dict[str, int]]:
    where = f"language {lang!r}"
    forget = ct.load(lang, forget_split)
    forget_p = ct.load(lang, f"{forget_split}_perturbed")
    retain_all = ct.load(lang, retain_split)
    retain_p_all = ct.load(lang, RETAIN_SCORED)
    n_forget = _blocks(len(forget), f"{where}, {forget_split}")
    if len(forget_p) != len(forget):
        raise ValueError(
            f"{where}: {forget_split}_perturbed has {len(forget_p)} rows, {forget_split} "
            f"{len(forget)}; they must hold the same forget authors"
        )
    n_have = _blocks(len(retain_all), f"{where}, {retain_split}")
    if len(retain_p_all) > len(retain_all):
        raise ValueError(
            f"{where}: {RETAIN_SCORED} has {len(retain_p_all)} rows, more than {retain_split}'s "
            f"{len(retain_all)}; its rows must be the first rows of {retain_split}"
        )
    n_retain = n_have if authors is None else authors
    if not 1 <= n_retain <= n_have:
        raise ValueError(f"{where}: authors={authors} retain authors asked, {retain_split} has {n_have}")
    retain = retain_all[: n_retain * QA_PER_AUTHOR]
    # retain_perturbed: TOFU's first authors, as many as a forget10 split of this world would hold
    retain_p = author_subset(retain_p_all, RETAIN_SCORED, n_retain + n_forget)
    eval_splits: dict[str, list[QAItem]] = {f"{forget_split}_perturbed": forget_p, RETAIN_SCORED: retain_p}
    files_agree = {
        forget_split: sum(map(same_text, forget, forget_p)),
        retain_split: sum(map(same_text, retain_all, retain_p)),
    }
    facts_from = lang if all(ct.has(lang, s) for s in FACT_SPLITS) else None
    if train_text == "scored":
        forget, retain = _scored_text(forget, forget_p), _scored_text(retain, retain_p_all)
    return _plain(forget), _plain(retain), eval_splits, facts_from, files_agree


def build_world(
    ct: CTOFU,
    langs: str | Sequence[str] | None = None,
    *,
    forget_split: str = FORGET_SPLIT,
    authors: int | None = None,
    facts: int | None = None,
    train_text: str = "scored",
) -> World:
    """The data of a run on ``langs`` (default all): every forget author of ``forget_split``, the first
    ``authors`` retain authors of the matching retain split (default all), and the first ``facts``
    real-authors and world-facts rows per language (default all).

    ``train_text``: ``"scored"`` (default) trains every scored row on the question/answer the metrics
    score (``<forget>_perturbed``, ``retain_perturbed``); ``"files"`` on ``forget01`` / ``retain99`` as
    shipped (module docstring; :meth:`World.text_agreement` shows what that costs).

    ``retain_perturbed`` keeps TOFU's share: its first ``forget_count(N, 10)`` authors for a world of
    N = retain + forget authors (the full data gives back its 400 rows). A language without
    translated real-authors / world-facts files borrows English's for its model utility
    (``facts_language`` says so) and contributes none to training.
    """
    languages = parse_langs(langs, ct.languages)
    retain_split = retain_split_for(forget_split)
    if train_text not in TRAIN_TEXTS:
        raise ValueError(f"train_text must be one of {', '.join(TRAIN_TEXTS)}, got {train_text!r}")
    if authors is not None and authors < 1:
        raise ValueError(f"authors must be >= 1 (retain authors kept), got {authors}")
    if facts is not None and facts < 1:
        raise ValueError(f"facts must be >= 1 (rows of each facts split kept per language), got {facts}")
    forget, retain, eval_data, facts_language, files_agree = {}, {}, {}, {}, {}
    counts = set()
    for lang in languages:
        f, r, ev, facts_from, files_agree[lang] = _language_data(
            ct, lang, forget_split, retain_split, authors, train_text
        )
        counts.add((len(f), len(r)))
        if facts_from is None:
            facts_from = ENGLISH if ENGLISH in ct.sources and all(ct.has(ENGLISH, s) for s in FACT_SPLITS) else None
            if facts_from is None:
                raise FileNotFoundError(
                    f"language {lang!r} has no {' / '.join(FACT_SPLITS)} files and there is "
                    f"no English to borrow them from (model utility needs them)"
                )
            log.warning(
                "cTOFU: %s has no translated real-authors / world-facts; its model utility uses English's", lang
            )
        for s in FACT_SPLITS:
            ev[s] = ct.load(facts_from, s)[:facts]
        forget[lang], retain[lang], facts_language[lang] = f, r, facts_from
        eval_data[lang] = SplitMapping(f"ctofu-{lang}[{forget_split}|r{authors}|facts{facts}]", ev)
    if len(counts) != 1:
        raise ValueError(
            f"languages disagree on the number of forget/retain rows: "
            f"{ {lang: (len(forget[lang]), len(retain[lang])) for lang in languages} }; "
            f"check the alignment report"
        )
    n_forget, n_retain = (n // QA_PER_AUTHOR for n in next(iter(counts)))
    forget_count(n_forget + n_retain, 10)  # validates the world size (>= 2 authors)
    return World(
        languages,
        forget_split,
        retain_split,
        n_retain,
        n_forget,
        facts,
        forget,
        retain,
        eval_data,
        facts_language,
        train_text,
        files_agree,
    )
