"""Row alignment of cTOFU translations with English: split-level errors and per-row suspects, as a report.

What "aligned" means here (row i of ``<split>_<lang>`` translates row i of the English split):

- split level (*errors*; a run cannot use the language): the file is readable, has the split's
  fields, the same number of rows as English, and every row as many perturbed answers as the English row;
- row level (*suspects*; reported, the run goes on): the row's anchors agree with the English row's,
  on question + answer:

  - numbers >= 100 (years, counts, distances), with any script's digits and digit grouping
    ("21 000", "21.000", "٢١٠٠٠" are 21000): a number the translation has and English has not,
    or one English has and the translation lacks (decades such as "1980s" may be spelled out
    in words, so English decades are not required);
  - names: in a text not written mostly in Latin script, every Latin-script word (a name left
    untranslated) must appear in the English row; in a Latin-script translation, at least one of
    the English row's proper names (capitalised, not sentence-initial) must appear in it. "Appear"
    allows inflection and transliteration noise (``difflib`` similarity >= 0.75 or a shared prefix).

  - answer length: the answer's length ratio (translation / English, in characters) is within a
    factor LENGTH_FACTOR of the split's median ratio (a row moved next to another row usually has
    a very different length; on the shipped data at most 6 of 3960 rows per language fall outside).

  Rows without numbers or names are counted as unanchored (only their length is checked).
  Machine translation makes a few suspects normal (checked on the shipped data: at most ~2% of retain99 rows per
  language); a shifted or swapped block shows up as a run of suspects, and the report names the nearby English row whose
  anchors the suspect row matches, when one does.

The report also holds, once a world is built (:meth:`AlignmentReport.add_text_agreement`), the
trained-vs-scored text check of :meth:`mmunlearn.data.ctofu.worlds.World.text_agreement`: per language and
split, how many scored rows the model is trained on with the identical question and answer, next to
how many the two shipped files share. A mismatch means the metrics score another wording than the
model learned; the report says whether the run was allowed to go on.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import statistics
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmunlearn.data.ctofu.worlds import CTOFU, ENGLISH, TextAgreement, World, parse_langs
from mmunlearn.data.tofu import QAItem, TOFUFormatError
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.metrics.logs import write_json_atomic
from mmunlearn.report import table

#: the report's tables: (header, field) of a SplitCheck and of a TextAgreement
CHECK_COLUMNS = (
    ("language", "lang"),
    ("split", "split"),
    ("rows", "rows"),
    ("anchored", "anchored"),
    ("suspect rows", "suspects"),
)
TEXT_COLUMNS = (
    ("language", "lang"),
    ("trained split", "split"),
    ("scored split", "scored_split"),
    ("rows scored", "scored"),
    ("trained = scored", "shared"),
    ("same in the two files", "in_files"),
)
MIN_NUMBER = 100
LENGTH_FACTOR = 2.5
SIMILAR = 0.75
HINT_WINDOW = 25
_SEP = "[,.'\u00a0\u202f\u066c ]"
_GROUPED = re.compile(rf"(?<!\d)\d{{1,3}}(?:{_SEP}\d{{3}})+(?!\d)")
_NUMBER = re.compile(r"\d+")
_DECADE = re.compile(r"(\d+0)'?s\b")
_WORD = re.compile(r"[^\W\d_]+(?:['’\-][^\W\d_]+)*")
_SENTENCE = re.compile(r"(?<=[.?!])\s+")


def _int(digits: str) -> int:
    return int("".join(str(unicodedata.decimal(c)) for c in digits if c.isdecimal()))


def numbers(text: str) -> set[int]:
    """Numbers >= MIN_NUMBER in ``text``, any script's decimal digits, grouped thousands joined."""
    found = {_int(m.group()) for m in _GROUPED.finditer(text)}
    rest = _GROUPED.sub(" ", text)
    found |= {_int(m.group()) for m in _NUMBER.finditer(rest)}
    return {n for n in found if n >= MIN_NUMBER}


def _is_latin(ch: str) -> bool:
    # the Latin blocks (Basic Latin to Latin Extended-B, IPA, Latin Extended Additional): a code-point
    # test, many times faster than unicodedata.name on every letter of 40k rows
    o = ord(ch)
    return o < 0x2B0 or 0x1E00 <= o < 0x1F00


def _fold(word: str) -> str:
    """Lower case without accents ('Égypte' -> 'egypte')."""
    return "".join(c for c in unicodedata.normalize("NFKD", word.lower()) if not unicodedata.combining(c))


def mostly_latin(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(map(_is_latin, letters)) >= 0.6 * len(letters)


def _latin_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if len(w) >= 3 and all(_is_latin(c) for c in w if c.isalpha())]


def _proper_names(text: str) -> list[str]:
    return [w for sent in _SENTENCE.split(text) for w in _WORD.findall(sent)[1:] if w[:1].isupper() and len(w) >= 4]


def _appears(word: str, vocabulary: set[str]) -> bool:
    """Whether ``word`` is in ``vocabulary`` (folded words), allowing inflection and transliteration noise."""
    w = _fold(word)
    if w in vocabulary or any(len(w) >= 4 and len(v) >= 4 and (v.startswith(w) or w.startswith(v)) for v in vocabulary):
        return True
    return bool(difflib.get_close_matches(w, vocabulary, n=1, cutoff=SIMILAR))


def _text(item: QAItem) -> str:
    return f"{item.question}\n{item.answer}"


def anchor_problems(english: QAItem, translated: QAItem) -> list[str] | None:
    """Why ``translated`` does not look like a translation of ``english`` ([] when it does; None when
    neither numbers nor names give anything to compare)."""
    en, tr = _text(english), _text(translated)
    problems: list[str] = []
    n_en, n_tr = numbers(en), numbers(tr)
    decades = {int(m.group(1)) for m in _DECADE.finditer(en)}
    checked = bool(n_en | n_tr)
    if n_tr - n_en:
        problems.append(f"numbers {sorted(n_tr - n_en)} not in the English row")
    if (n_en - decades) - n_tr:
        problems.append(f"English numbers {sorted((n_en - decades) - n_tr)} missing")
    if mostly_latin(tr):
        names = _proper_names(en)
        if names:
            checked = True
            vocab = {_fold(w) for w in _WORD.findall(tr)}
            if not any(_appears(n, vocab) for n in names):
                problems.append(f"none of the English names {sorted(set(names))[:4]} appear")
    else:
        latin = _latin_words(tr)
        if latin:
            checked = True
            vocab = {_fold(w) for w in _WORD.findall(en)}
            stray = [w for w in latin if not _appears(w, vocab)]
            if stray:
                problems.append(f"Latin-script words {stray[:4]} not in the English row")
    return problems if checked else None


@dataclass(frozen=True)
class RowIssue:
    """A suspect row: its language, split, index, reasons, the nearby English row its anchors match."""

    lang: str
    split: str
    row: int
    reasons: list[str]
    english: str
    translated: str
    matches_english_row: int | None = None


@dataclass(frozen=True)
class SplitCheck:
    lang: str
    split: str
    rows: int
    anchored: int
    suspects: int


@dataclass
class AlignmentReport:
    """Errors (split level) and suspects (row level) of every checked (language, split)."""

    reference: str = ENGLISH
    checks: list[SplitCheck] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)  # {"lang", "split", "error"}
    suspects: list[RowIssue] = field(default_factory=list)
    texts: list[TextAgreement] = field(default_factory=list)  # trained vs scored text, per language and split
    train_text: str | None = None  # the world's train_text, once add_text_agreement has run
    text_mismatch_allowed: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    def bad_languages(self) -> list[str]:
        return sorted({e["lang"] for e in self.errors})

    def add_text_agreement(self, world: World, allowed: bool = False) -> list[TextAgreement]:
        """Record ``world``'s trained-vs-scored text counts (and whether a mismatch may go on); returns
        the mismatched (language, split) entries."""
        self.texts = world.text_agreement()
        self.train_text = world.train_text
        self.text_mismatch_allowed = allowed
        return self.text_mismatches()

    def text_mismatches(self) -> list[TextAgreement]:
        return [t for t in self.texts if not t.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "ok": self.ok,
            "errors": self.errors,
            "checks": [asdict(c) for c in self.checks],
            "suspects": [asdict(s) for s in self.suspects],
            "train_text": self.train_text,
            "texts": [asdict(t) for t in self.texts],
            "text_mismatches": len(self.text_mismatches()),
            "text_mismatch_allowed": self.text_mismatch_allowed,
        }

    def _text_lines(self) -> list[str]:
        source = {
            "scored": "each scored row's question/answer from the file the metrics score",
            "files": "the training files' own question/answer",
        }.get(self.train_text or "", self.train_text)
        lines = [
            "",
            f"Trained vs scored text (trained on {source}): rows the metrics score, and how many of them "
            f"the model is trained on with the identical question and answer",
            "",
            table([vars(t) for t in self.texts], TEXT_COLUMNS),
        ]
        bad = self.text_mismatches()
        if bad:
            what = (
                "allowed for this run: these metrics partly score another wording than the model learned"
                if self.text_mismatch_allowed
                else "the run stops"
            )
            lines += ["", f"**Trained text differs from scored text** ({what}):", ""]
            lines += [
                f"- {t.lang} / {t.split}: {t.shared} of {t.scored} rows shared; first differing rows "
                f"{', '.join(map(str, t.differing_rows))}"
                for t in bad
            ]
        return lines

    def markdown(self, max_rows: int = 20) -> str:
        lines = [f"Alignment with {self.reference} (row i of each translation vs row i of the English split)", ""]
        if self.errors:
            lines += ["**Errors** (the language cannot be used as it is):", ""]
            lines += [f"- {e['lang']} / {e['split']}: {e['error']}" for e in self.errors] + [""]
        lines.append(table([vars(c) for c in self.checks], CHECK_COLUMNS))
        if self.suspects:
            lines += ["", f"Suspect rows (first {min(max_rows, len(self.suspects))} of {len(self.suspects)}):", ""]
            for s in self.suspects[:max_rows]:
                j = s.matches_english_row
                hint = f"; its anchors match English row {j}" if j is not None else ""
                lines.append(f"- {s.lang} / {s.split} row {s.row}: {'; '.join(s.reasons)}{hint}")
        if self.texts:
            lines += self._text_lines()
        return "\n".join(lines)

    def write(self, out_dir: str | os.PathLike) -> tuple[Path, Path]:
        """``alignment.json`` and ``alignment.md`` in ``out_dir`` (each written atomically)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        js = write_json_atomic(out / "alignment.json", self.to_dict())
        md = write_text_atomic(out / "alignment.md", self.markdown() + "\n")
        return js, md


def _hint(english: Sequence[QAItem], translated: QAItem, row: int) -> int | None:
    """The nearest other English row (within HINT_WINDOW) with the translated row's anchors, compared
    exactly (numbers, and the Latin-script words of a non-Latin text): cheap enough for every suspect."""
    tr = _text(translated)
    n_tr = numbers(tr)
    words = set() if mostly_latin(tr) else {_fold(w) for w in _latin_words(tr)}
    if len(n_tr) + len(words) < 2:  # one anchor matches too many rows by chance
        return None
    for d in range(1, HINT_WINDOW + 1):
        for j in (row - d, row + d):
            if 0 <= j < len(english):
                en = _text(english[j])
                if (not n_tr or numbers(en) == n_tr) and words <= {_fold(w) for w in _WORD.findall(en)}:
                    return j
    return None


def _structure_errors(english: Sequence[QAItem], translated: Sequence[QAItem]) -> str | None:
    if len(english) != len(translated):
        return f"{len(translated)} rows, English has {len(english)}"
    bad = [i for i, (e, t) in enumerate(zip(english, translated)) if len(e.perturbed_answer) != len(t.perturbed_answer)]
    if bad:
        return f"rows {bad[:10]} have a different number of perturbed answers than the English rows"
    return None


def check_split(
    english: Sequence[QAItem], translated: Sequence[QAItem], lang: str, split: str
) -> tuple[SplitCheck, str | None, list[RowIssue]]:
    """Check one translated split against English: (counts, split-level error or None, suspect rows)."""
    error = _structure_errors(english, translated)
    if error and len(english) != len(translated):
        return SplitCheck(lang, split, len(translated), 0, 0), error, []
    ratios = [math.log(max(len(t.answer), 1) / max(len(e.answer), 1)) for e, t in zip(english, translated)]
    median = statistics.median(ratios) if ratios else 0.0
    issues, anchored = [], 0
    for i, (e, t) in enumerate(zip(english, translated)):
        problems = anchor_problems(e, t)
        anchored += problems is not None
        problems = list(problems or [])
        if abs(ratios[i] - median) > math.log(LENGTH_FACTOR):
            problems.append(
                f"answer length ratio {math.exp(ratios[i]):.2f} vs the split's median {math.exp(median):.2f}"
            )
        if problems:
            issues.append(RowIssue(lang, split, i, problems, _text(e)[:160], _text(t)[:160], _hint(english, t, i)))
    return SplitCheck(lang, split, len(translated), anchored, len(issues)), error, issues


def check_alignment(
    ct: CTOFU,
    langs: str | Sequence[str] | None = None,
    splits: Sequence[str] | None = None,
    *,
    required: Sequence[str] = (),
) -> AlignmentReport:
    """Check every translated language in ``langs`` (default all) against English, split by split.

    ``splits``: the splits to check (default: every split English and the language both have);
    ``required``: splits whose absence in a language is an error (e.g. the forget and retain splits).
    Splits English lacks are skipped (nothing to compare with).
    """
    report = AlignmentReport()
    if ENGLISH not in ct.sources:
        report.errors.append({"lang": "*", "split": "*", "error": "no English data to check the rows against"})
        return report
    english_splits = set(ct.splits(ENGLISH))
    english: dict[str, list[QAItem]] = {}
    for lang in parse_langs(langs, ct.languages):
        if lang == ENGLISH:
            continue
        have = set(ct.splits(lang))
        for split in required:
            if split not in have:
                report.errors.append({"lang": lang, "split": split, "error": "file missing"})
        names = splits if splits is not None else sorted(have & english_splits)
        for split in names:
            if split not in have or split not in english_splits:
                continue
            try:
                translated = ct.load(lang, split)
            except (TOFUFormatError, ValueError) as e:
                report.errors.append({"lang": lang, "split": split, "error": str(e)})
                continue
            if split not in english:
                english[split] = ct.load(ENGLISH, split)
            check, error, issues = check_split(english[split], translated, lang, split)
            report.checks.append(check)
            report.suspects.extend(issues)
            if error:
                report.errors.append({"lang": lang, "split": split, "error": error})
    return report
