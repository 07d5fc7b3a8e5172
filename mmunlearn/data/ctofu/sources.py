"""Opening cTOFU data: each language's TOFU source (files found by name, synthetic or a mapping), language choice.

Layout (that of ``../shared/data/ctofu``, after the Multilingual Amnesia release): one JSON list per
split and language, ``<split>_<lang>.json`` (``forget01_ar.json``, ``forget01_perturbed_ar.json``,
``retain99_ar.json``, ``retain_perturbed_ar.json``, ``real_authors_perturbed_ar.json``,
``world_facts_perturbed_ar.json``), each row-aligned with the English TOFU split of the same name.
English comes from a TOFU folder (``english=``), from ``<split>_en.json`` files, or from a ``tofu``
folder beside the cTOFU one. The languages are whatever the file names hold, never a fixed list.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.data.ctofu.synthetic import synthetic_ctofu_from_spec
from mmunlearn.data.tofu import QAItem, TOFUFormatError, list_splits, load_split, parse_rows, split_info

log = logging.getLogger(__name__)

ENGLISH = "en"
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
            raise KeyError(
                f"language {lang!r} not in the cTOFU data ({self.description}); "
                f"languages found: {', '.join(self.languages) or 'none'}"
            )
        return self.sources[lang]

    def splits(self, lang: str) -> list[str]:
        return list_splits(self.source(lang))

    def has(self, lang: str, split: str) -> bool:
        return split in self.splits(lang)

    def load(self, lang: str, split: str) -> list[QAItem]:
        try:
            return load_split(self.source(lang), split)
        except (FileNotFoundError, KeyError) as e:
            raise FileNotFoundError(
                f"cTOFU split {split!r} is missing for language {lang!r} "
                f"({self.description}); it has {', '.join(self.splits(lang))}"
            ) from e


def open_ctofu(
    data: str | os.PathLike | Mapping[str, Any], english: str | os.PathLike | Mapping | None = None
) -> CTOFU:
    """The cTOFU languages of ``data``: a folder of ``<split>_<lang>.json`` files, ``"synthetic[:...]"``
    (the built-in stand-in, :mod:`mmunlearn.data.ctofu.synthetic`) or a mapping language -> TOFU source.

    ``english``: a TOFU source for ``en`` (a folder of ``<split>.json`` or a mapping). Without it,
    ``<split>_en.json`` files or a ``tofu`` folder beside ``data`` serve; else there is no English.
    """
    if isinstance(data, Mapping):
        sources = dict(data)
        desc = "mapping"
    elif isinstance(data, str) and (data == "synthetic" or data.startswith("synthetic:")):
        sources = synthetic_ctofu_from_spec(data)
        desc = data
    else:
        folder = Path(os.fspath(data)).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(
                f"cTOFU source {os.fspath(data)!r}: no such folder (expected "
                f"<split>_<lang>.json files, or 'synthetic[:...]')"
            )
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
        raise ValueError(f"languages {unknown or spec!r} not available; choose from {', '.join(available)} or 'all'")
    return tuple(dict.fromkeys(names))
