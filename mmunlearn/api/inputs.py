"""The forget and retain sets of ``mmunlearn.unlearn``, read for the model's kind and checked before any model work.

Text LLMs take question-answer rows or prompt-less text (:func:`~mmunlearn.data.user.sets.read_text_rows`); every
kind that takes audio takes manifests, (path, label) lists, JSON/JSONL or Hugging Face datasets
(:func:`~mmunlearn.data.user.sets.read_speech_rows`). A forget row that is also a retain row is refused (the two sets
would ask for opposite things), and so is a forget speaker that is also a retain speaker when the rule forgets
speakers.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmunlearn.data.user.sets import DataFormatError, overlap, read_speech_rows, read_text_rows, split_held_out
from mmunlearn.errors import UserError
from mmunlearn.kinds import Kind
from mmunlearn.speech.spoken_qa import spoken_qa


class OverlapError(UserError, ValueError):
    """The forget and retain sets share rows (or, for speaker forgetting, speakers)."""


@dataclass
class Inputs:
    """What a method runs on: ``forget`` (a list of rows, or of forget sets for a batch), ``retain`` (the rows it may
    train on) and ``held_retain`` (retain rows set aside for the sweep rule's retain measure; empty: score
    ``retain``)."""

    forget: list[Any]
    retain: list[Any]
    held_retain: list[Any]

    @property
    def forget_rows(self) -> list[Any]:
        """Every forget row (a batch's sets joined)."""
        return [r for s in self.forget for r in s] if self.forget and isinstance(self.forget[0], list) else self.forget


def batch_of(forget: Any) -> bool:
    """Whether ``forget`` is a list of forget-set files (``.csv``, ``.json``, ``.jsonl`` paths): a batch of requests."""
    return (
        isinstance(forget, (list, tuple))
        and bool(forget)
        and all(
            isinstance(f, (str, os.PathLike)) and os.fspath(f).lower().endswith((".csv", ".json", ".jsonl", ".tsv"))
            for f in forget
        )
    )


def read_rows(kind: Kind, source: Any, name: str, audio_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The rows of one set for a model of ``kind``: text rows for a kind that reads text, manifest rows otherwise."""
    if kind.takes_audio:
        return read_speech_rows(source, name, audio_dir=audio_dir)
    return read_text_rows(source, name)


def spoken(adapter_takes_text: bool, rows: list[dict[str, Any]], tasks: Sequence[str]) -> list[dict[str, Any]]:
    """Spoken questions about ``rows`` for a speech LLM (rows that already hold a question and answer stay)."""
    if not adapter_takes_text or all("question" in r and "answer" in r for r in rows):
        return rows
    return spoken_qa(rows, tasks)


def _row_key(kind: Kind):
    if kind.takes_audio:
        return lambda r: (str(r["wav"]), r.get("start"), r.get("stop"))
    return ("question", "answer")


def check_disjoint(
    kind: Kind, forget: list[Mapping[str, Any]], retain: list[Mapping[str, Any]], by_speaker: bool
) -> None:
    """Refuse forget rows that are also retain rows,
    and with ``by_speaker`` forget speakers that are retain speakers."""
    shared = overlap(forget, retain, key=_row_key(kind))
    if shared:
        first = shared[0].get("wav") if kind.takes_audio else shared[0].get("question") or shared[0].get("answer")
        raise OverlapError(
            f"{len(shared)} forget row(s) are also retain rows (e.g. {str(first)[:120]!r}): a row cannot "
            "be both forgotten and kept; remove it from one of the sets"
        )
    if by_speaker:
        both = sorted({str(r["spk_id"]) for r in forget} & {str(r["spk_id"]) for r in retain})
        if both:
            raise OverlapError(
                f"speaker(s) {both[:5]} are in both the forget and the retain set: speaker forgetting "
                "removes every clip of a forget speaker, so none may be kept; remove their retain rows"
            )


def check_labels(rows: Sequence[Mapping[str, Any]], classes: Sequence[str], name: str) -> None:
    """Refuse rows whose speaker is not one of a classifier's ``classes``, naming them and the closest class."""
    known = {str(c) for c in classes}
    unknown = sorted({str(r["spk_id"]) for r in rows} - known)
    if not unknown:
        return
    hints = [
        f"{u!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, known, n=1)) else repr(u)
        for u in unknown[:5]
    ]
    raise DataFormatError(
        f"{name}: speaker label(s) {', '.join(hints)}{' ...' if len(unknown) > 5 else ''} are not "
        f"classes of the model (it has {len(known)}: {', '.join(sorted(known)[:8])}"
        f"{' ...' if len(known) > 8 else ''}); the label column must hold the model's class names"
    )


def read_inputs(
    kind: Kind,
    forget: Any,
    retain: Any,
    *,
    batch: bool,
    by_speaker: bool,
    audio_dir: str | os.PathLike | None = None,
    hold_out: float = 0.0,
    seed: int = 0,
) -> Inputs:
    """Read both sets for ``kind`` and check them (:func:`check_disjoint`); ``hold_out`` of the retain rows are set
    aside for the rule's retain measure (text LLMs: the rule then sees rows no method trained on)."""
    if batch:
        sets = [read_rows(kind, f, f"forget set {i}", audio_dir) for i, f in enumerate(forget)]
        rows = [r for s in sets for r in s]
    else:
        sets = None
        rows = read_rows(kind, forget, "forget", audio_dir)
    retain_rows = read_rows(kind, retain, "retain", audio_dir)
    check_disjoint(kind, rows, retain_rows, by_speaker)
    held: list[Any] = []
    if hold_out > 0:
        fit, held = split_held_out(retain_rows, fraction=hold_out, seed=seed)
        if held:
            retain_rows = fit
    return Inputs(sets if sets is not None else rows, retain_rows, held)


__all__ = [
    "DataFormatError",
    "Inputs",
    "OverlapError",
    "batch_of",
    "check_disjoint",
    "check_labels",
    "read_inputs",
    "read_rows",
    "spoken",
]
