"""Cross-lingual TOFU (cTOFU): per-language TOFU splits, language discovery, and the multilingual
training and evaluation data of one run.

Layout (that of ``../shared/data/ctofu``, after the Multilingual Amnesia release): one JSON list per
split and language, ``<split>_<lang>.json`` (``forget01_ar.json``, ``forget01_perturbed_ar.json``,
``retain99_ar.json``, ``retain_perturbed_ar.json``, ``real_authors_perturbed_ar.json``,
``world_facts_perturbed_ar.json``), each row-aligned with the English TOFU split of the same name.
English comes from a TOFU folder (``english=``), from ``<split>_en.json`` files, or from a ``tofu``
folder beside the cTOFU one. The languages are whatever the file names hold, never a fixed list.

A *world* (:func:`build_world`) fixes the languages, keeps every forget author and the first N
retain authors (``authors``), optionally the first K real-authors / world-facts rows per language
(``facts``), and gives the combined training data (``full`` = retain + forget of every language,
``retainRR``; what :func:`mmunlearn.presets.build.build_models` reads) and one TOFU data source per
language for :func:`mmunlearn.eval.evaluate_tofu`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from mmunlearn.data.tofu import (QA_PER_AUTHOR, QAItem, TOFUFormatError, author_subset, forget_count, list_splits,
                                 load_split, parse_rows, split_info)

log = logging.getLogger(__name__)

ENGLISH = "en"
FORGET_SPLIT = "forget01"  # the only forget split the shipped translations have
FACT_SPLITS = ("real_authors_perturbed", "world_facts_perturbed")
_LANG_RE = re.compile(r"[a-z]{2,3}(?:-[A-Za-z0-9]{2,8})?")


def split_and_language(stem: str) -> tuple[str, str] | None:
    """``'forget01_perturbed_ar'`` -> ``('forget01_perturbed', 'ar')``; None when the name is not a
    TOFU split name followed by ``_<language code>`` (2-3 lower-case letters, optional ``-tag``)."""
    head, sep, lang = stem.rpartition("_")
    if not sep or not _LANG_RE.fullmatch(lang):
        return None
    try:
        info = split_info(head)
    except ValueError:
        return None
    return None if info.family == "custom" else (head, lang)


class LanguageFiles(Mapping):
    """One language's splits, read on first use from ``<split>_<lang>.json`` files; a TOFU source
    for :func:`mmunlearn.data.tofu.load_split` (split name -> records)."""

    def __init__(self, lang: str, files: Mapping[str, Path]):
        self.lang = lang
        self.files = dict(files)
        self._cache: dict[str, list[QAItem]] = {}

    def __getitem__(self, split: str) -> list[QAItem]:
        if split not in self._cache:
            path = self.files[split]  # KeyError for an unknown split, as a dict source gives
            try:
                rows = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise TOFUFormatError(f"{path}: cannot read a JSON list of records ({e})") from e
            self._cache[split] = parse_rows(rows, split, str(path))
        return self._cache[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __repr__(self) -> str:
        folders = sorted({str(p.parent) for p in self.files.values()})
        return f"LanguageFiles({self.lang!r}, {', '.join(folders)})"


def _discover(folder: Path) -> dict[str, dict[str, Path]]:
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        parsed = split_and_language(path.stem) if path.suffix == ".json" and path.is_file() else None
        if parsed:
            found.setdefault(parsed[1], {})[parsed[0]] = path
    return found


def _is_tofu_folder(path: Path) -> bool:
    return path.is_dir() and any(path.glob("forget*.json"))


@dataclass(frozen=True)
class CTOFU:
    """Every language's TOFU source (a folder of ``<split>.json``, :class:`LanguageFiles` or a mapping)."""

    sources: Mapping[str, Any]
    description: str = ""

    @property
    def languages(self) -> tuple[str, ...]:
        """Language codes, English first, then alphabetical."""
        return tuple(sorted(self.sources, key=lambda lang: (lang != ENGLISH, lang)))

    def source(self, lang: str) -> Any:
        if lang not in self.sources:
            raise KeyError(f"language {lang!r} not in the cTOFU data ({self.description}); "
                           f"languages found: {', '.join(self.languages) or 'none'}")
        return self.sources[lang]

    def splits(self, lang: str) -> list[str]:
        return list_splits(self.source(lang))

    def has(self, lang: str, split: str) -> bool:
        return split in self.splits(lang)

    def load(self, lang: str, split: str) -> list[QAItem]:
        try:
            return load_split(self.source(lang), split)
        except (FileNotFoundError, KeyError) as e:
            raise FileNotFoundError(f"cTOFU split {split!r} is missing for language {lang!r} "
                                    f"({self.description}); it has {', '.join(self.splits(lang))}") from e


def open_ctofu(data: str | os.PathLike | Mapping[str, Any], english: str | os.PathLike | Mapping | None = None
               ) -> CTOFU:
    """The cTOFU languages of ``data``: a folder of ``<split>_<lang>.json`` files, ``"synthetic[:...]"``
    (the built-in stand-in, :mod:`mmunlearn.data.ctofu_synthetic`) or a mapping language -> TOFU source.

    ``english``: a TOFU source for ``en`` (a folder of ``<split>.json`` or a mapping). Without it,
    ``<split>_en.json`` files or a ``tofu`` folder beside ``data`` serve; else there is no English.
    """
    if isinstance(data, Mapping):
        sources = dict(data)
        desc = "mapping"
    elif isinstance(data, str) and (data == "synthetic" or data.startswith("synthetic:")):
        from mmunlearn.data.ctofu_synthetic import synthetic_ctofu_from_spec

        sources = synthetic_ctofu_from_spec(data)
        desc = data
    else:
        folder = Path(os.fspath(data)).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"cTOFU source {os.fspath(data)!r}: no such folder (expected "
                                    f"<split>_<lang>.json files, or 'synthetic[:...]')")
        sources = {lang: LanguageFiles(lang, files) for lang, files in _discover(folder).items()}
        if not sources:
            raise FileNotFoundError(f"{folder}: no <split>_<lang>.json files (e.g. forget01_fr.json)")
        desc = str(folder)
        sibling = folder.parent / "tofu"
        if english is None and ENGLISH not in sources and _is_tofu_folder(sibling):
            english = sibling
            log.info("cTOFU: English from %s", sibling)
    if english is not None:
        sources[ENGLISH] = english
        desc += f" + English from {english if not isinstance(english, Mapping) else 'a mapping'}"
    return CTOFU(sources, desc)


def parse_langs(spec: str | Sequence[str] | None, available: Sequence[str]) -> tuple[str, ...]:
    """``'all'`` / None -> every available language; ``'en,fr,ar'`` -> those (checked), in that order."""
    if spec is None or spec == "all":
        return tuple(available)
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        raise ValueError(f"languages {unknown or spec!r} not available; choose from {', '.join(available)} "
                         f"or 'all'")
    return tuple(dict.fromkeys(names))


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
        splits = {"full": [it for lang in langs for it in self.retain[lang] + self.forget[lang]],
                  self.retain_split: self.items("retain", langs), self.forget_split: self.items("forget", langs)}
        for key in (f"{self.forget_split}_perturbed", "retain_perturbed"):
            splits[key] = [it for lang in langs for it in self.eval_data[lang][key]]
        owners = {self.facts_language[lang]: lang for lang in reversed(langs)}  # one language per facts source
        for key in FACT_SPLITS:
            splits[key] = [it for fl in dict.fromkeys(self.facts_language[lang] for lang in langs)
                           for it in self.eval_data[owners[fl]][key]]
        return SplitMapping(f"ctofu[{','.join(langs)}|{self._tag()}]", splits)

    def _tag(self) -> str:
        return f"{self.forget_split}|r{self.retain_authors}|facts{self.facts if self.facts is not None else 'all'}"

    def describe(self) -> dict[str, Any]:
        return {"languages": list(self.languages), "forget_split": self.forget_split,
                "retain_split": self.retain_split, "retain_authors": self.retain_authors,
                "forget_authors": self.forget_authors, "facts_per_language": self.facts,
                "rows_per_language": {lang: {"forget": len(self.forget[lang]), "retain": len(self.retain[lang]),
                                             **{k: len(v) for k, v in self.eval_data[lang].items()}}
                                      for lang in self.languages},
                "facts_language": dict(self.facts_language)}


def _blocks(n_rows: int, what: str) -> int:
    if n_rows % QA_PER_AUTHOR:
        raise ValueError(f"{what}: {n_rows} rows are not whole authors of {QA_PER_AUTHOR} QA")
    return n_rows // QA_PER_AUTHOR


def _language_data(ct: CTOFU, lang: str, forget_split: str, retain_split: str, authors: int | None
                   ) -> tuple[list, list, dict, str | None]:
    where = f"language {lang!r}"
    forget = ct.load(lang, forget_split)
    forget_p = ct.load(lang, f"{forget_split}_perturbed")
    retain_all = ct.load(lang, retain_split)
    n_forget = _blocks(len(forget), f"{where}, {forget_split}")
    if len(forget_p) != len(forget):
        raise ValueError(f"{where}: {forget_split}_perturbed has {len(forget_p)} rows, {forget_split} "
                         f"{len(forget)}; they must hold the same forget authors")
    n_have = _blocks(len(retain_all), f"{where}, {retain_split}")
    n_retain = n_have if authors is None else authors
    if not 1 <= n_retain <= n_have:
        raise ValueError(f"{where}: authors={authors} retain authors asked, {retain_split} has {n_have}")
    retain = retain_all[: n_retain * QA_PER_AUTHOR]
    # retain_perturbed: TOFU's first authors, as many as a forget10 split of this world would hold
    retain_p = author_subset(ct.load(lang, "retain_perturbed"), "retain_perturbed", n_retain + n_forget)
    eval_splits: dict[str, list[QAItem]] = {f"{forget_split}_perturbed": forget_p, "retain_perturbed": retain_p}
    facts_from = lang if all(ct.has(lang, s) for s in FACT_SPLITS) else None
    return _plain(forget), _plain(retain), eval_splits, facts_from


def build_world(ct: CTOFU, langs: str | Sequence[str] | None = None, *, forget_split: str = FORGET_SPLIT,
                authors: int | None = None, facts: int | None = None) -> World:
    """The data of a run on ``langs`` (default all): every forget author of ``forget_split``, the first
    ``authors`` retain authors of the matching retain split (default all), and the first ``facts``
    real-authors and world-facts rows per language (default all).

    ``retain_perturbed`` keeps TOFU's share: its first ``forget_count(N, 10)`` authors for a world of
    N = retain + forget authors (the full data gives back its 400 rows). A language without
    translated real-authors / world-facts files borrows English's for its model utility
    (``facts_language`` says so) and contributes none to training.
    """
    languages = parse_langs(langs, ct.languages)
    retain_split = retain_split_for(forget_split)
    if authors is not None and authors < 1:
        raise ValueError(f"authors must be >= 1 (retain authors kept), got {authors}")
    if facts is not None and facts < 1:
        raise ValueError(f"facts must be >= 1 (rows of each facts split kept per language), got {facts}")
    forget, retain, eval_data, facts_language = {}, {}, {}, {}
    counts = set()
    for lang in languages:
        f, r, ev, facts_from = _language_data(ct, lang, forget_split, retain_split, authors)
        counts.add((len(f), len(r)))
        if facts_from is None:
            facts_from = ENGLISH if ENGLISH in ct.sources and all(ct.has(ENGLISH, s) for s in FACT_SPLITS) else None
            if facts_from is None:
                raise FileNotFoundError(f"language {lang!r} has no {' / '.join(FACT_SPLITS)} files and there is "
                                        f"no English to borrow them from (model utility needs them)")
            log.warning("cTOFU: %s has no translated real-authors / world-facts; its model utility uses English's",
                        lang)
        for s in FACT_SPLITS:
            ev[s] = ct.load(facts_from, s)[:facts]
        forget[lang], retain[lang], facts_language[lang] = f, r, facts_from
        eval_data[lang] = SplitMapping(f"ctofu-{lang}[{forget_split}|r{authors}|facts{facts}]", ev)
    if len(counts) != 1:
        raise ValueError(f"languages disagree on the number of forget/retain rows: "
                         f"{ {lang: (len(forget[lang]), len(retain[lang])) for lang in languages} }; "
                         f"check the alignment report")
    n_forget, n_retain = (n // QA_PER_AUTHOR for n in next(iter(counts)))
    forget_count(n_forget + n_retain, 10)  # validates the world size (>= 2 authors)
    return World(languages, forget_split, retain_split, n_retain, n_forget, facts, forget, retain, eval_data,
                 facts_language)
