"""Forget and retain sets in the formats users have, read into the rows the adapters take
(text QA rows, speech manifest rows).

:func:`read_text_rows` gives ``{"question", "answer"}`` rows (the schema
:class:`~mmunlearn.adapters.text.adapter.TextLLMAdapter`
reads) from JSON, JSONL, CSV or ``.txt`` files, lists of dicts, (question, answer) pairs or strings, and Hugging Face
``datasets.Dataset`` objects. Prompt-less text becomes ``question=""``, ``answer=<text>``.
:func:`read_speech_rows` gives manifest rows (``ID``, ``wav``, ``spk_id``, ...) from SpeechBrain manifests, 2-column
CSVs, JSON/JSONL, lists of (path, label) pairs or dicts, and ``datasets.Dataset`` objects with an audio column
(encoded audio is written as 16-bit WAV files into ``audio_dir``). Relative audio paths resolve against the folder of
the file that names them, and every audio file is checked (:func:`~mmunlearn.data.manifest.check_rows`) before the rows
are returned. :func:`overlap` finds rows present in two sets; :func:`split_held_out` sets a part aside for scoring.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mmunlearn.data.user.files import DataFormatError, fields_found, fields_named, short, source_items
from mmunlearn.data.user.speech import read_speech_rows

__all__ = ["DataFormatError", "read_text_rows", "read_speech_rows", "duplicate_count", "overlap", "split_held_out"]

LOG = logging.getLogger(__name__)

#: Field names (case-insensitive) read as the question, the answer, or prompt-less text.
QUESTION_FIELDS: tuple[str, ...] = ("question", "prompt", "input", "instruction")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "response", "output", "completion", "target")
TEXT_FIELDS: tuple[str, ...] = ("text",)
#: Optional fields of a question-answer row: other wordings of its question (a list of strings, or one string) and
#: the key span of its answer (the private fact a greedy answer must not give).
PARAPHRASE_FIELDS: tuple[str, ...] = ("paraphrases", "paraphrase")
KEY_FIELDS: tuple[str, ...] = ("key",)


# ---------------------------------------------------------------------------------------------- text
def _string(value: Any, where: str, what: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: {what} is not text (got {type(value).__name__} {short(value)})")
    return value.strip()


def _text_row(item: Any, where: str) -> dict[str, Any]:
    """One ``{"question", "answer"}`` row from a mapping, a (question, answer) pair or a string."""
    if isinstance(item, str):
        question, answer = "", _string(item, where, "the text")
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        question, answer = _string(item[0], where, "the question"), _string(item[1], where, "the answer")
    elif isinstance(item, Mapping):
        qs, ans, texts = (fields_named(item, names) for names in (QUESTION_FIELDS, ANSWER_FIELDS, TEXT_FIELDS))
        if len(qs) > 1 or len(ans) > 1 or (texts and (qs or ans)):
            clash = qs if len(qs) > 1 else ans if len(ans) > 1 else texts + qs + ans
            raise DataFormatError(
                f"{where}: ambiguous fields {', '.join(map(repr, clash))}: keep one question and "
                f"one answer field, or only 'text' (fields found: {fields_found(item)})"
            )
        if texts:
            question, answer = "", _string(item[texts[0]], where, f"field {texts[0]!r}")
        elif qs and ans:
            question = _string(item[qs[0]], where, f"field {qs[0]!r}")
            answer = _string(item[ans[0]], where, f"field {ans[0]!r}")
        else:
            raise DataFormatError(
                f"{where}: no {'answer' if qs else 'question' if ans else 'question/answer or text'} field (fields "
                f"found: {fields_found(item)}); expected one of {'|'.join(QUESTION_FIELDS)} with one of "
                f"{'|'.join(ANSWER_FIELDS)}, or {'|'.join(TEXT_FIELDS)}"
            )
    else:
        raise DataFormatError(
            f"{where}: expected an object with question/answer or text fields, a (question, "
            f"answer) pair or a string, got {type(item).__name__} {short(item)}"
        )
    if not answer:
        raise DataFormatError(f"{where}: empty {'text' if not question else 'answer'} (nothing to score)")
    row: dict[str, Any] = {"question": question, "answer": answer}
    if isinstance(item, Mapping):
        row.update(_extras(item, where, question))
    return row


def _extras(item: Mapping[str, Any], where: str, question: str) -> dict[str, Any]:
    """A row's optional ``paraphrases`` (a list of strings) and ``key`` (a string), read from :data:`PARAPHRASE_FIELDS`
    and :data:`KEY_FIELDS`."""
    out: dict[str, Any] = {}
    para = fields_named(item, PARAPHRASE_FIELDS)
    if para and item[para[0]] not in (None, "", []):
        value = item[para[0]]
        listed = [value] if isinstance(value, str) else value
        if not isinstance(listed, (list, tuple)):
            raise DataFormatError(
                f"{where}: field {para[0]!r} must be a string or a list of strings, got "
                f"{type(value).__name__} {short(value)}"
            )
        if not question:
            raise DataFormatError(f"{where}: paraphrases need a question (this row is prompt-less text)")
        out["paraphrases"] = [_string(p, where, f"a paraphrase in {para[0]!r}") for p in listed]
    key = fields_named(item, KEY_FIELDS)
    if key and item[key[0]] not in (None, ""):
        out["key"] = _string(item[key[0]], where, f"field {key[0]!r}")
    return out


def read_text_rows(source: Any, name: str) -> list[dict[str, Any]]:
    """A text forget/retain set as ``{"question", "answer"}`` rows, in the source's order.

    ``source``: a path to ``.json`` (a list of rows, or an object with the list under ``"data"`` or ``"rows"``),
    ``.jsonl``, ``.csv``/``.tsv`` (header row) or ``.txt`` (one text per line; when blank lines occur, each
    blank-line-separated paragraph is one text); a list of dicts, of (question, answer) pairs or of strings; a
    ``datasets.Dataset``. Field names, case-insensitive: :data:`QUESTION_FIELDS` -> question, :data:`ANSWER_FIELDS`
    -> answer, ``text`` -> prompt-less text, given as ``question=""``, ``answer=<text>``; optional ``paraphrases``
    (other wordings of the question, a list or one string) and ``key`` (the answer's private fact) are kept, for the
    text rule's greedy checks; other fields are ignored.
    Values are stripped; numbers become text. ``name`` (e.g. ``"forget"``) names an in-memory set in messages.
    Raises :class:`DataFormatError` naming the file (or set) and row for a missing or ambiguous field (listing the
    fields found), a value that is not text, an empty answer, an unreadable file, and an empty set. Duplicate rows are
    kept (logged; :func:`duplicate_count` counts them).
    """
    items, _ = source_items(source, name, text=True)
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else name
    if not items:
        raise DataFormatError(f"{label}: the {name} set is empty")
    rows = [_text_row(item, where) for where, item in items]
    dups = duplicate_count(rows)
    if dups:
        LOG.warning("%s: %d duplicate row(s) in the %s set, kept", label, dups, name)
    return rows


def _normal(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return " ".join(value.split()) if isinstance(value, str) else value


Key = str | Sequence[str] | Callable[[Mapping[str, Any]], Any]


def _key_of(key: Key) -> Callable[[Mapping[str, Any]], Any]:
    if callable(key):
        return key
    names = (key,) if isinstance(key, str) else tuple(key)
    return lambda row: tuple(_normal(row.get(k)) for k in names)


def duplicate_count(rows: Sequence[Mapping[str, Any]], key: Key = ("question", "answer")) -> int:
    """How many rows repeat an earlier row's ``key`` (field names compared after whitespace normalisation, or a
    function of the row)."""
    counts = Counter(_key_of(key)(row) for row in rows)
    return sum(n - 1 for n in counts.values())


def overlap(
    forget_rows: Sequence[Mapping[str, Any]],
    retain_rows: Sequence[Mapping[str, Any]],
    key: Key = ("question", "answer"),
) -> list[Mapping[str, Any]]:
    """The forget rows whose ``key`` also occurs among the retain rows, in forget order.

    ``key``: a field name or names (string values compared after collapsing whitespace: ``" a  b "`` == ``"a b"``;
    no case folding), or a function of a row. Text rows: the default (question and answer); ``"question"`` also finds
    a question asked with another answer (prompt-less rows all share ``question=""``). Speech rows: ``"wav"``
    (:func:`read_speech_rows` gives absolute paths) or ``("wav", "start", "stop")`` for segments.
    """
    of = _key_of(key)
    retained = {of(row) for row in retain_rows}
    return [row for row in forget_rows if of(row) in retained]


def _units(indices: Sequence[int], of: Callable[[int], Any]) -> list[list[int]]:
    """``indices`` grouped by ``of(index)``, groups in first-seen order."""
    groups: dict[Any, list[int]] = {}
    for i in indices:
        groups.setdefault(of(i), []).append(i)
    return list(groups.values())


def _held(units: list[list[int]], fraction: float, rng: random.Random) -> set[int]:
    """The row indices of ``round(fraction * len(units))`` units (at least 1, at most all but 1) drawn by ``rng``."""
    if len(units) < 2:
        return set()
    k = min(len(units) - 1, max(1, round(fraction * len(units))))
    return {i for u in rng.sample(range(len(units)), k) for i in units[u]}


def split_held_out(
    rows: Sequence[Mapping[str, Any]], fraction: float = 0.2, seed: int = 0, min_rows: int = 2
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(fit rows, held-out rows): ``fraction`` of ``rows`` set aside, e.g. for the sweep rule to score on.

    Deterministic for a ``seed``; both parts keep the input order. Text rows: identical rows (question and answer
    after whitespace normalisation) stay on one side, so no held-out row is also fitted. Speech rows (every row has
    ``spk_id``): each speaker is split on its own, so it appears on both sides -- by recording (the rows of one
    ``wav`` file, e.g. its segments, stay together) when it has two or more, else by row; a speaker with one row
    stays on the fit side; when that leaves nothing held out, the rows are split as a whole. Each split draws
    ``round(fraction * units)`` units, at least 1 and at most all but 1; with fewer than ``min_rows`` rows, or
    every text row the same, ``held`` is empty (the caller decides: score on the fit rows, or refuse).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if min_rows < 2:
        raise ValueError(f"min_rows must be >= 2 (one row on each side), got {min_rows}")
    rows = list(rows)
    rng = random.Random(f"held-out:{seed}")
    if len(rows) < min_rows:
        return rows, []
    held: set[int] = set()
    if all(isinstance(r, Mapping) and "spk_id" in r for r in rows):

        def recording(i: int) -> Any:  # an in-memory waveform is a recording of its own
            wav = _normal(rows[i].get("wav"))
            return wav if isinstance(wav, str) else ("row", i)

        for spk in _units(range(len(rows)), lambda i: str(rows[i]["spk_id"])):
            by_wav = _units(spk, recording)
            held |= _held(by_wav if len(by_wav) > 1 else [[i] for i in spk], fraction, rng)
        if not held:
            held = _held([[i] for i in range(len(rows))], fraction, rng)
    else:
        text = _key_of(("question", "answer"))
        held = _held(_units(range(len(rows)), lambda i: text(rows[i])), fraction, rng)
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]
