"""A built-in multilingual stand-in for cross-lingual TOFU (tests and demos without the real files).

English is the synthetic TOFU world of :mod:`mmunlearn.data.synthetic` in the cTOFU layout: R retain
authors (``retain99``), F forget authors (``forget01`` / ``forget01_perturbed``; 2, as in the real
forget01), ``retain_perturbed`` (the first min(20, R) authors) and the built-in real-authors and
world-facts sets. The other "languages" are deterministic pseudo-translations, NOT real
translations: ``fr`` swaps common English words for French ones (Latin script, names kept);
``ar``, ``hi``, ``ja``, ``ko`` and ``ru`` keep capitalised words (names, as the real translations
often do) and spell every other word letter by letter in the language's script (``ar`` also writes
digits as Arabic-Indic digits). Rows stay aligned with English, so alignment checks pass on them,
and every script of the real data's tokenizer tests appears.

``retranslated`` names splits whose non-English rows are translated a second time, differently
(``variant=1`` of :func:`pseudo_translate`: other French words and French spacing before ``?``,
``!``, ``:`` and ``;``; the other scripts' letters shifted by one), as the shipped
``forget01_perturbed_<lang>`` files were translated apart from ``forget01_<lang>``: the same rows,
names and numbers, but a question/answer text that differs from the training file's.

The recipes read it as ``--data synthetic[:...]``, i.e. :func:`synthetic_ctofu_from_spec` of e.g.
``"synthetic:retain_authors=8,forget_authors=2,langs=en/fr/ar,seed=0"``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from mmunlearn.data.facts import real_author_items, world_fact_items
from mmunlearn.data.qa import QAItem
from mmunlearn.data.synthetic import author_items, synthetic_authors
from mmunlearn.files.atomic import write_text_atomic

# 26 letters of each script, standing in for a..z (consonants where the script has more)
ALPHABETS = {
    "ar": "ابتثجحخدذرزسشصضطظعغفقكلمنه",
    "hi": "कखगघचछजझटठडढतथदधनपफबभमयरलव",
    "ja": "アイウエオカキクケコサシスセソタチツテトナニヌネノハ",
    "ko": "가나다라마바사아자차카타파하거너더러머버서어저처커터",
    "ru": "абвгдежзийклмнопрстуфхцчшщ",
}
DIGITS = {"ar": "٠١٢٣٤٥٦٧٨٩"}
FRENCH = {
    "the": "le",
    "of": "de",
    "and": "et",
    "is": "est",
    "was": "était",
    "in": "dans",
    "his": "son",
    "her": "sa",
    "who": "qui",
    "what": "quel",
    "author": "auteur",
    "born": "né",
    "book": "livre",
    "books": "livres",
    "father": "père",
    "mother": "mère",
    "name": "nom",
    "with": "avec",
    "for": "pour",
    "on": "sur",
    "a": "un",
    "an": "un",
    "by": "par",
    "from": "de",
    "work": "œuvre",
    "works": "œuvres",
    "award": "prix",
    "city": "ville",
    "writes": "écrit",
    "wrote": "écrivit",
    "did": "a",
    "does": "fait",
    "where": "où",
    "when": "quand",
    "which": "quel",
    "has": "a",
    "had": "avait",
    "as": "comme",
    "their": "leur",
    "this": "ce",
    "that": "que",
}
# a second French wording (the ``variant=1`` translation); words it lacks fall back to FRENCH
FRENCH_ALT = {
    "the": "la",
    "of": "du",
    "and": "ainsi que",
    "is": "demeure",
    "was": "fut",
    "in": "en",
    "his": "ses",
    "her": "ses",
    "who": "lequel",
    "what": "quelle",
    "author": "écrivain",
    "born": "née",
    "book": "ouvrage",
    "books": "ouvrages",
    "father": "papa",
    "mother": "maman",
    "name": "nommez",
    "with": "auprès de",
    "for": "afin de",
    "on": "le",
    "a": "une",
    "an": "une",
    "by": "chez",
    "from": "depuis",
    "work": "travail",
    "works": "travaux",
    "writer": "romancier",
    "writes": "rédige",
    "wrote": "rédigea",
    "did": "fit",
    "does": "fait-il",
    "where": "en quel lieu",
    "when": "à quel moment",
    "which": "laquelle",
    "has": "possède",
    "had": "eut",
    "as": "en tant que",
    "that": "ce",
    "how": "comment",
    "date": "jour",
    "first": "premier",
    "famous": "célèbre",
    "grew": "grandit",
    "at": "à",
    "prefers": "préfère",
    "critics": "les critiques",
    "voice": "style",
    "back": "jusqu'à",
    "often": "souvent",
    "usually": "d'habitude",
}
LANGUAGES = ("en", "fr", *ALPHABETS)
SPLITS = (
    "forget01",
    "forget01_perturbed",
    "retain99",
    "retain_perturbed",
    "real_authors_perturbed",
    "world_facts_perturbed",
)
_WORD = re.compile(r"[A-Za-z]+")

if any(len(a) != 26 for a in ALPHABETS.values()) or any(len(d) != 10 for d in DIGITS.values()):
    raise RuntimeError("ctofu_synthetic: every stand-in alphabet needs 26 letters and 10 digits")


def pseudo_translate(text: str, lang: str, variant: int = 0) -> str:
    """``text`` in the stand-in language ``lang`` (deterministic; see the module docstring).

    ``variant`` 1 is a second translation of the same text with other wording (``retranslated``
    splits); English has one wording only.
    """
    if variant not in (0, 1):
        raise ValueError(f"variant must be 0 (first translation) or 1 (second translation), got {variant!r}")
    if lang == "en":
        return text
    if lang == "fr":
        table = {**FRENCH, **FRENCH_ALT} if variant else FRENCH

        def swap(m: re.Match) -> str:
            word = m.group()
            new = table.get(word.lower())
            return word if new is None else (new.capitalize() if word[0].isupper() else new)

        out = _WORD.sub(swap, text)
        return re.sub(r"\s*([?!:;])", r" \1", out) if variant else out
    if lang not in ALPHABETS:
        raise ValueError(f"no stand-in for language {lang!r}; choose from {', '.join(LANGUAGES)}")
    letters = ALPHABETS[lang]

    def spell(m: re.Match) -> str:
        word = m.group()
        if word[0].isupper():
            return word
        return "".join(letters[(ord(c) - ord("a") + variant) % len(letters)] for c in word.lower())

    out = _WORD.sub(spell, text)
    if lang in DIGITS:
        out = "".join(DIGITS[lang][int(c)] if "0" <= c <= "9" else c for c in out)
    return out


def _translate_item(item: QAItem, lang: str, variant: int = 0) -> QAItem:
    def tr(t: str | None) -> str | None:
        return None if t is None else pseudo_translate(t, lang, variant)

    return replace(
        item,
        question=tr(item.question),
        answer=tr(item.answer),
        paraphrased_answer=tr(item.paraphrased_answer),
        paraphrased_question=tr(item.paraphrased_question),
        perturbed_answer=tuple(tr(p) for p in item.perturbed_answer),
    )


def english_standin(retain_authors: int = 8, forget_authors: int = 2, seed: int = 0) -> dict[str, list[QAItem]]:
    """The English splits of the stand-in (cTOFU names; QAItem.author 0..R-1 retain, R.. forget)."""
    if retain_authors < 1 or forget_authors < 1:
        raise ValueError(f"need at least one retain and one forget author, got {retain_authors}, {forget_authors}")
    authors = synthetic_authors(retain_authors + forget_authors, seed=seed)
    rich = [author_items(a, seed=seed) for a in authors]

    def rows(first: int, stop: int, full: bool) -> list[QAItem]:
        picked = [it for block in rich[first:stop] for it in block]
        return picked if full else [QAItem(it.question, it.answer, author=it.author) for it in picked]

    n = retain_authors + forget_authors
    return {
        "forget01": rows(retain_authors, n, False),
        "forget01_perturbed": rows(retain_authors, n, True),
        "retain99": rows(0, retain_authors, False),
        "retain_perturbed": rows(0, min(20, retain_authors), True),
        "real_authors_perturbed": real_author_items(seed),
        "world_facts_perturbed": world_fact_items(seed),
    }


def synthetic_ctofu(
    langs: Sequence[str] = LANGUAGES,
    retain_authors: int = 8,
    forget_authors: int = 2,
    seed: int = 0,
    retranslated: Sequence[str] = (),
) -> dict[str, dict[str, list[QAItem]]]:
    """language -> split -> records of the stand-in (English plus pseudo-translations).

    ``retranslated``: splits (e.g. ``("forget01_perturbed",)``) whose non-English rows are a second
    translation (``variant=1``), so their question/answer differ from the other splits' wording of
    the same rows, as in the shipped cTOFU files.
    """
    unknown = [lang for lang in langs if lang not in LANGUAGES]
    if unknown or not langs:
        raise ValueError(f"stand-in languages {unknown or list(langs)} unknown; choose from {', '.join(LANGUAGES)}")
    bad = [s for s in retranslated if s not in SPLITS]
    if bad:
        raise ValueError(f"retranslated splits {bad} unknown; choose from {', '.join(SPLITS)}")
    english = english_standin(retain_authors, forget_authors, seed)
    return {
        lang: {s: [_translate_item(it, lang, int(s in retranslated)) for it in items] for s, items in english.items()}
        for lang in langs
    }


_SPEC = {
    "retain_authors": int,
    "forget_authors": int,
    "seed": int,
    "langs": lambda s: tuple(s.split("/")),
    "retranslated": lambda s: tuple(s.split("/")),
}


def synthetic_ctofu_from_spec(spec: str) -> dict[str, dict[str, list[QAItem]]]:
    """``'synthetic[:retain_authors=8,forget_authors=2,langs=en/fr/ar,seed=0,retranslated=forget01_perturbed]'``
    -> :func:`synthetic_ctofu`."""
    head, _, rest = spec.partition(":")
    if head != "synthetic":
        raise ValueError(f"synthetic source must start with 'synthetic', got {spec!r}")
    kwargs: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in _SPEC:
            raise ValueError(
                f"bad option {part!r} in {spec!r}; use key=value with keys {', '.join(_SPEC)} "
                f"(langs like en/fr/ar, retranslated like forget01_perturbed/retain_perturbed)"
            )
        try:
            kwargs[key] = _SPEC[key](value)
        except ValueError as e:
            raise ValueError(f"bad value for {key!r} in {spec!r}: {e}") from e
    return synthetic_ctofu(**kwargs)  # type: ignore[arg-type]


def write_language_files(
    splits_by_lang: Mapping[str, Mapping[str, Sequence[QAItem]]], folder: str | os.PathLike
) -> list[Path]:
    """Write ``<split>_<lang>.json`` files (the cTOFU layout) into ``folder``, each atomically."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lang, splits in splits_by_lang.items():
        for split, items in splits.items():
            path = out / f"{split}_{lang}.json"
            write_text_atomic(path, json.dumps([it.to_dict() for it in items], ensure_ascii=False, indent=1))
            written.append(path)
    return written
