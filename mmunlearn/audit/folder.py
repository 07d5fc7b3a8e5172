"""Audit an unlearning output folder (the harness's layout, :mod:`mmunlearn.methods.harness`) against target
and retain model folders: what ``mmunlearn audit`` and the recipes' ``--audit`` call.

Text LLMs read TOFU-schema data (the forget split's ``_perturbed`` rows, whose paraphrased questions the
paraphrase attack asks, and the matching ``holdoutPP`` for the probe); speaker classifiers read the prepared
VoxCeleb2-layout manifests (:mod:`mmunlearn.data.manifest`). A folder with ``tilt/`` is T3's: the tilted model
is audited at the output, its base (the unchanged weights in its ``base/``) by the white-box attacks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmunlearn.adapters.speech_llm.adapter import KIND as SPEECH_LLM
from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.audit.options import AuditOptions
from mmunlearn.audit.runner import audit_nll, audit_speaker, audit_text
from mmunlearn.data.tofu import load_split, split_info
from mmunlearn.data.utterances import LEVELS, split_rows
from mmunlearn.eval.splits import load_eval_splits
from mmunlearn.kinds import get_kind, kind_of, kinds
from mmunlearn.methods import load_unlearned, model_folder
from mmunlearn.methods.harness import REPORT_NAME
from mmunlearn.speech.spoken_qa import spoken_qa

#: the largest ``unlearn_report.json`` read (a report is kilobytes)
REPORT_LIMIT = 64 << 20


def read_report(folder: str | Path) -> dict[str, Any]:
    """The folder's ``unlearn_report.json`` (a ValueError naming the folder when it is not a harness output)."""
    path = Path(folder) / REPORT_NAME
    if not path.is_file():
        raise ValueError(f"{folder}: no {REPORT_NAME} (not an unlearning output folder written by mmunlearn)")
    if path.stat().st_size > REPORT_LIMIT:
        raise ValueError(f"{path}: {path.stat().st_size:,} bytes, larger than an unlearning report may be")
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not an unlearning report: nested too deeply") from None
    if not isinstance(report, dict) or not isinstance(report.get("method"), str):
        raise ValueError(f"{path}: no 'method' recorded")
    return report


#: What :func:`folder_report` records as the method of a folder mmunlearn did not write.
NO_HISTORY = "not an mmunlearn output: no history"


def detect_kind(folder: str | Path) -> str | None:
    """The registered kind (:mod:`mmunlearn.kinds`) of a plain model folder by its files (e.g. ``speaker``: a
    SpeechBrain layout, ``hf-audio``: a Hugging Face audio classifier, ``speech-llm``: a supported speech LLM,
    ``text``: any other config.json); None when none fits."""
    kind = kind_of(folder)
    return kind.name if kind is not None else None


def folder_report(folder: str | Path) -> dict[str, Any]:
    """The folder's ``unlearn_report.json``; for any other loadable model folder of a supported kind (the original
    model, another tool's output) a stand-in whose method says :data:`NO_HISTORY`."""
    if (Path(folder) / REPORT_NAME).is_file():
        return read_report(folder)
    kind = detect_kind(folder)
    if kind is None:
        raise ValueError(
            f"{folder}: neither an mmunlearn output ({REPORT_NAME}) nor a model folder of a supported "
            f"kind ({'; '.join(k.description for k in kinds())})"
        )
    return {"method": NO_HISTORY, "model_kind": kind}


def load_text_unlearned(folder: str | Path, device: str = "auto") -> Any:
    """The unlearned text model of an output folder (a head-making method's, T3's, wraps the unchanged base beside
    it: the method's artefacts load it)."""
    return load_unlearned(folder, TextLLMAdapter.from_pretrained(model_folder(folder), device=device))


def text_data(data: Any, forget_split: str, authors: int | None) -> tuple[list, list, list]:
    """(forget rows with paraphrases and perturbed answers, holdout rows, retain rows) of a TOFU source."""
    splits = load_eval_splits(data, forget_split, authors, ("forget", "mia"))
    pct = split_info(forget_split).forget_pct
    retain = load_split(data, f"retain{100 - pct:02d}", authors=authors, forget_pct=pct)
    return list(splits.forget), list(splits.holdout), retain


def audit_text_folder(
    folder: str | Path,
    target: str | Path,
    retain: str | Path,
    data: Any,
    *,
    forget_split: str = "forget10",
    authors: int | None = None,
    options: AuditOptions | None = None,
    device: str = "auto",
    languages: Mapping[str, Sequence[Any]] | None = None,
    cache: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit the text model in ``folder`` against the ``target`` and ``retain`` model folders on ``data``."""
    report = folder_report(folder)
    forget, holdout, retain_items = text_data(data, forget_split, authors)
    result = audit_text(
        load_text_unlearned(folder, device),
        TextLLMAdapter.from_pretrained(target, device=device),
        TextLLMAdapter.from_pretrained(retain, device=device),
        forget,
        holdout,
        method=report["method"],
        options=options,
        retain_items=retain_items,
        languages=languages,
        cache=cache,
        progress=progress,
    )
    result["models"] = {"unlearned": str(folder), "target": str(target), "retain": str(retain)}
    return result


def speaker_rows(manifests: Any, level: str) -> dict[str, Any]:
    """What :func:`audit_speaker` reads from prepared manifests at one level (``speaker`` or ``sample``)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if level == "speaker":
        forget = split_rows(manifests, "spk_forget_train")
        heldout = split_rows(manifests, "spk_forget_test")
        probe = heldout + split_rows(manifests, "spk_retain_test")
        return {
            "forget_rows": forget,
            "heldout_forget": heldout,
            "probe_rows": probe,
            "forget_speakers": sorted({str(r["spk_id"]) for r in forget}),
            "retain_rows": split_rows(manifests, "spk_retain_train"),
        }
    return {
        "forget_rows": split_rows(manifests, "sample_forget"),
        "retain_rows": split_rows(manifests, "sample_retain"),
    }


def load_classifier(folder: str | Path, device: str = "auto") -> Any:
    """The adapter of a speaker-classifier folder of any classifier kind (SpeechBrain, Hugging Face audio)."""
    kind = kind_of(folder)
    if kind is None or not kind.is_classifier:
        raise ValueError(
            f"{folder}: not a speaker classifier folder of a supported kind "
            f"({'; '.join(k.description for k in kinds() if k.is_classifier)})"
        )
    return kind.load(folder, device=device)


def audit_speaker_models(
    unlearned: Any,
    original: str | Path,
    retrained: str | Path,
    manifests: Any,
    *,
    level: str = "speaker",
    method: str,
    options: AuditOptions | None = None,
    device: str = "auto",
    cache: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit a speaker classifier (an adapter, or a harness output folder) against the ``original`` and
    ``retrained`` classifier folders on prepared ``manifests``; the function ``voxceleb2 speaker|sample
    --audit`` calls with each method's unlearned adapter."""
    if isinstance(unlearned, (str, Path)):
        unlearned = load_classifier(unlearned, device)
    result = audit_speaker(
        unlearned,
        load_classifier(original, device),
        load_classifier(retrained, device),
        method=method,
        options=options,
        cache=cache,
        progress=progress,
        model_kind=kind_of(original).name,
        **speaker_rows(manifests, level),
    )
    result["level"] = level
    result["models"] = {"target": str(original), "retain": str(retrained)}
    return result


def load_speech_llm_unlearned(folder: str | Path, device: str = "auto") -> Any:
    """The unlearned speech LLM of an output folder (T3's wraps the unchanged base beside it: its artefacts load it)."""
    return load_unlearned(folder, SpeechLLMAdapter.from_pretrained(model_folder(folder), device=device))


def audit_speech_llm_folder(
    folder: str | Path,
    target: str | Path,
    retain: str | Path,
    manifests: Any,
    *,
    method: str,
    task: str = "speaker",
    options: AuditOptions | None = None,
    device: str = "auto",
    cache: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit a speech LLM output folder on the spoken question ``task`` asked of the forget speakers'
    recordings (``spk_forget_train``); relearning's retain data: the same question on ``spk_retain_train``."""
    forget = spoken_qa(split_rows(manifests, "spk_forget_train"), (task,))
    retain_items = spoken_qa(split_rows(manifests, "spk_retain_train"), (task,))
    result = audit_nll(
        load_speech_llm_unlearned(folder, device),
        SpeechLLMAdapter.from_pretrained(target, device=device),
        SpeechLLMAdapter.from_pretrained(retain, device=device),
        forget,
        method=method,
        model_kind=SPEECH_LLM.name,
        options=options,
        retain_items=retain_items,
        cache=cache,
        progress=progress,
    )
    result["models"] = {"unlearned": str(folder), "target": str(target), "retain": str(retain)}
    return result


def audit_folder(
    folder: str | Path, target: str | Path, retain: str | Path, data: Any, **kwargs: Any
) -> dict[str, Any]:
    """Audit any harness output folder (the model kind read from its report) or any loadable model folder of a
    supported kind (kind told by its files; method reported as :data:`NO_HISTORY`).

    ``kwargs``: for text, :func:`audit_text_folder`'s; for speakers ``level`` (default: the report's) and
    :func:`audit_speaker_models`'s options."""
    report = folder_report(folder)
    name = report.get("model_kind")
    try:
        kind = get_kind(name) if isinstance(name, str) else None
    except ValueError:
        kind = None
    if kind is None:
        raise ValueError(
            f"{folder}: model kind {name!r} has no audit yet (audited kinds: {', '.join(k.name for k in kinds())})"
        )
    if kind.is_classifier:
        for key in ("forget_split", "authors", "languages"):
            kwargs.pop(key, None)
        level = kwargs.pop("level", None) or report.get("level") or "speaker"
        return audit_speaker_models(folder, target, retain, data, level=level, method=report["method"], **kwargs)
    if kind.takes_audio:
        return audit_speech_llm_folder(
            folder,
            target,
            retain,
            data,
            method=report["method"],
            **{k: v for k, v in kwargs.items() if k in ("options", "device", "cache", "progress")},
        )
    kwargs.pop("level", None)
    return audit_text_folder(folder, target, retain, data, **kwargs)
