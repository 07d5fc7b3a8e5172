"""``mmunlearn.load(folder)``: the unlearned model of an output folder, ready to use, whatever method wrote it.

A weight-editing method's output is the model itself in its input format (``from_pretrained`` loads it too);
a T3 output is not: its ``base/`` holds the unchanged target and ``tilt/`` the head that makes the unlearning,
and its top-level config.json makes ``from_pretrained`` fail (:mod:`mmunlearn.methods.artefacts`). This loader
reads any of them through the kind registry (:mod:`mmunlearn.kinds`) and the method's artefacts, so a T3 output
comes back as :class:`~mmunlearn.tilt.TiltedCausalLM`, whose ``forward`` and ``generate`` are the tilted ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.files.layout import UNLEARN_REPORT
from mmunlearn.files.undo_store import read_release_report
from mmunlearn.kinds import kind_of, kinds
from mmunlearn.methods import load_unlearned, model_folder


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` returns; ``model, tokenizer = mmunlearn.load(folder)`` unpacks the first two.

    ``model``: the unlearned model (T3: the tilted :class:`~mmunlearn.tilt.TiltedCausalLM`); ``tokenizer``: the
    language model's tokenizer (None for a classifier); ``adapter``: mmunlearn's adapter around ``model`` (its
    scoring and ``generate``); ``kind``: the registered model kind; ``method``: the method that wrote the folder
    (None for a folder without ``unlearn_report.json``); ``model_dir``: the folder the weights were read from."""

    model: Any
    tokenizer: Any
    adapter: Any
    kind: str
    method: str | None
    model_dir: Path

    def __iter__(self) -> Iterator[Any]:
        yield self.model
        yield self.tokenizer


def _report(folder: Path) -> dict[str, Any] | None:
    """The folder's ``unlearn_report.json`` (None without one): at most 64 MiB, no link followed, a special file or
    a report that is not a JSON object refused naming it (:func:`mmunlearn.files.undo_store.read_release_report`)."""
    return read_release_report(folder)


def _format_of(folder: Path) -> str | None:
    """The prompt format a text LLM's rows were scored and trained in (the report's ``prompt_format``), if recorded."""
    report = _report(folder) or {}
    fmt = report.get("prompt_format")
    return fmt.get("format") if isinstance(fmt, dict) and isinstance(fmt.get("format"), str) else None


def _method_of(folder: Path) -> str | None:
    path = folder / UNLEARN_REPORT
    report = _report(folder)
    if report is None:
        return None
    method = report.get("method")
    if not isinstance(method, str):
        raise ValueError(f"{path}: no 'method' recorded")
    return method


def load(folder: str | os.PathLike, device: str = "auto", **options: Any) -> Loaded:
    """The unlearned model of an output ``folder`` (any method, any registered kind) or of a plain model folder.

    ``options`` go to the kind's loader (e.g. ``trust_hparams`` for a SpeechBrain folder; ``prompt_format`` for a
    text LLM, default the format its report records, so ``adapter.generate`` asks in the format the run used). A T3
    output gives the
    tilted model around the base in its ``base/`` (whose place ``tilt/tilt_config.json`` records relative to the
    folder, so a moved or copied folder loads); an absolute or escaping path recorded there is refused.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    weights = model_folder(folder)
    kind = kind_of(weights)
    if kind is None:
        raise ValueError(
            f"{weights}: not a model folder of a supported kind ({'; '.join(k.description for k in kinds())})"
        )
    recorded = _format_of(folder)
    if recorded is not None and "prompt_format" not in options:
        options = {**options, "prompt_format": recorded}
    adapter = load_unlearned(folder, kind.load(weights, device=device, **options))
    tokenizer = None if kind.is_classifier else adapter.tokenizer
    return Loaded(adapter.model, tokenizer, adapter, kind.name, _method_of(folder), weights)


__all__ = ["Loaded", "load"]
