"""The voice-pipeline entry point: one call unlearns speakers (or utterances) from a speech model on disk.

``unlearn(model_dir, forget=..., retain=..., method="qr-erase", out=...)`` loads either kind of speech
model, a speaker classifier in SpeechBrain's ``EncoderClassifier`` layout (``hyperparams.yaml``) or a
speech LLM in ``save_pretrained`` layout (Qwen2-Audio, Qwen2.5-Omni, Qwen3-Omni), runs an unlearning
method of :mod:`mmunlearn.methods.registry` and writes the edited model to ``out`` in the format it
was read from, plus ``unlearn_report.json`` (and, for the erasure methods, the erase report, its
undo patch and the per-layer energy plot). The input directory is never modified.

``forget`` / ``retain`` are each a manifest CSV (``ID,duration,wav,start,stop,spk_id[,gender,text]``),
a list of manifest rows, or a list of ``(audio path, label)`` pairs (label: the speaker ID). For a
speech LLM the rows become spoken questions (:mod:`mmunlearn.speech.llm_tasks`): the forget set asks
``forget_tasks`` (default: "Who is speaking?"), the retain set ``retain_tasks`` (default the same;
add ``"gender"`` to protect the gender answer on the same audio).

Example, on the built-in synthetic corpus (the recipe's helpers build the corpus and a trained ``mini``
speech LLM, cached; ``reference`` is the model it was fine-tuned from)::

    import mmunlearn
    from recipes.speech_llm import build_model, make_corpus, method_settings

    man = make_corpus("corpus")  # 10 espeak speakers in the VoxCeleb2 layout, 2 to forget, and manifests
    target, base = (build_model(man, preset="mini", role=r) for r in ("target", "base"))
    result = mmunlearn.unlearn(target, forget=man / "spk_forget_train.csv", retain=man / "spk_retain_train.csv",
                               method="qr-erase", out="unlearned-speech-llm", reference=base,
                               retain_tasks=("speaker", "gender"), settings=method_settings("mini"))
    print(result.report["forget_nll"], result.report["retain_nll"])
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from mmunlearn.methods.registry import ERASE_METHODS, METHODS, MethodSettings, run_method

REPORT_NAME = "unlearn_report.json"
KINDS = ("speaker", "speech-llm")


@dataclass
class UnlearnResult:
    """The unlearned adapter (in memory), where it was written, and the report written beside it."""

    adapter: Any
    out: Path | None
    report: dict[str, Any]


def model_kind(model_dir: str | os.PathLike) -> str:
    """``speaker`` (a SpeechBrain directory) or ``speech-llm`` (a supported ``config.json``)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    if (root / "hyperparams.yaml").is_file():
        return "speaker"
    if (root / "config.json").is_file():
        from mmunlearn.adapters.speech_llm_families import family_of_dir

        family_of_dir(root)  # raises for a model type that is not a speech LLM
        return "speech-llm"
    raise ValueError(f"{root} is neither a speaker classifier (hyperparams.yaml) nor a speech LLM (config.json)")


def load_model(model_dir: str | os.PathLike, *, device: str = "auto", where: str = "both"):
    """The adapter of a model directory of either kind (``where`` applies to speech LLMs)."""
    if model_kind(model_dir) == "speaker":
        from mmunlearn.adapters.speaker import SpeakerAdapter

        return SpeakerAdapter.load(model_dir, device=device)
    from mmunlearn.adapters.speech_llm import SpeechLLMAdapter

    return SpeechLLMAdapter.load(model_dir, device=device, where=where)


def read_items(source: str | os.PathLike | Sequence[Any], name: str) -> list[dict[str, Any]]:
    """Manifest rows from a CSV path, a list of rows (dicts), or a list of (audio path, label) pairs."""
    from mmunlearn.data.manifest import read_manifest

    if isinstance(source, (str, os.PathLike)):
        return read_manifest(source)
    rows = []
    for i, item in enumerate(source):
        if isinstance(item, Mapping):
            rows.append(dict(item))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            audio, label = item
            rows.append({"ID": f"{name}{i}", "wav": str(audio) if isinstance(audio, os.PathLike) else audio,
                         "spk_id": str(label)})
        else:
            raise ValueError(f"{name}[{i}]: expected a manifest row (dict) or an (audio path, label) pair, "
                             f"got {type(item).__name__}")
    if not rows:
        raise ValueError(f"{name} is empty")
    return rows


def _examples(adapter, rows: list[dict[str, Any]], tasks: Sequence[str]) -> list[dict[str, Any]]:
    from mmunlearn.adapters.speech_llm import SpeechLLMAdapter
    from mmunlearn.speech.llm_tasks import spoken_qa

    if not isinstance(adapter, SpeechLLMAdapter):
        return rows
    if all("question" in r and "answer" in r for r in rows):
        return rows  # already spoken-QA examples
    return spoken_qa(rows, tasks)


def default_settings(kind: str, progress: bool = True) -> MethodSettings:
    """Method settings for a model directory of ``kind`` (real-checkpoint scale: small steps)."""
    from mmunlearn.baselines import BaselineConfig
    from mmunlearn.taskvec.extract import ExtractConfig
    from mmunlearn.methods.erase_method import EraseMethodConfig

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "speaker":  # the VoxCeleb2 recipe's settings for its ``small`` ECAPA classifier
        return MethodSettings(
            erase=EraseMethodConfig(rank=1, retain_rank=32, scale=8.0,
                                    extract=ExtractConfig(kind="finetune", steps=20, lr=1e-3, batch_size=16)),
            baseline=BaselineConfig(epochs=5, lr=1e-4, batch_size=16, weight_decay=0.0), train_mode=False,
            progress=progress)
    return MethodSettings(
        erase=EraseMethodConfig(rank=16, retain_rank=64, scale=1.0,
                                extract=ExtractConfig(kind="finetune", steps=30, lr=1e-4, batch_size=8)),
        baseline=BaselineConfig(epochs=5, lr=1e-5, batch_size=8, weight_decay=0.0), progress=progress)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if k != "report"}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def unlearn(model_dir: str | os.PathLike, forget: Any, retain: Any, method: str = "qr-erase",
            out: str | os.PathLike | None = None, *, reference: str | os.PathLike | None = None, where: str = "both",
            forget_tasks: Sequence[str] = ("speaker",), retain_tasks: Sequence[str] = ("speaker",),
            settings: MethodSettings | None = None, device: str = "auto", overwrite: bool = False,
            progress: bool = True) -> UnlearnResult:
    """Unlearn ``forget`` from the speech model in ``model_dir`` and write the result to ``out``.

    Args:
        model_dir: a speaker-classifier directory (SpeechBrain layout) or a speech-LLM directory.
        forget / retain: manifest CSV, list of manifest rows, or list of (audio path, speaker label).
        method: one of :data:`mmunlearn.methods.registry.METHODS` (``qr-erase``, ``svd-unlearn``,
            ``grad_ascent``, ``grad_diff``, ``kl``, ``npo``, ``simnpo``, ``t3``; ``t3`` needs a speech LLM).
        out: output directory (None: nothing is written; the adapter is returned). For ``t3`` the base
            weights are unchanged: ``out`` holds the base model and the tilt head in ``out/tilt``.
        reference: the model directory ``model_dir`` was fine-tuned from (same kind and layout), when
            there is one: the erasure methods take task vectors from it, which localises what the
            fine-tuning on the forget data added (default: ``model_dir`` itself; for a speaker classifier
            a copy of it, so fine-tuning for task vectors leaves the edited model's BatchNorm statistics alone).
        where: speech LLMs: erase/train in the ``audio`` tower, the ``text`` model, or ``both``.
        forget_tasks / retain_tasks: speech LLMs: the spoken questions asked of each set.
        settings: method settings (default :func:`default_settings` of the model kind).
    Returns:
        :class:`UnlearnResult` with the adapter, ``out`` and the report (also ``out/unlearn_report.json``).
    """
    from mmunlearn.methods.erase_method import mean_nll

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    kind = model_kind(model_dir)
    if method == "t3" and kind == "speaker":
        raise ValueError("t3 tilts a language model's next-token distribution; a speaker classifier has none "
                         "(use qr-erase, svd-unlearn or a baseline)")
    if out is not None and Path(out).exists() and not overwrite:
        raise FileExistsError(f"output directory already exists: {out} (pass overwrite=True to replace it)")
    adapter = load_model(model_dir, device=device, where=where)
    base = None
    if reference is not None:
        if model_kind(reference) != kind:
            raise ValueError(f"reference {reference} is a {model_kind(reference)} model, {model_dir} a {kind} model")
        base = load_model(reference, device=device, where=where)
    elif kind == "speaker" and method in ERASE_METHODS:
        base = adapter.clone()  # fine-tuning for task vectors moves BatchNorm statistics: do it on a copy
    forget_items = _examples(adapter, read_items(forget, "forget"), forget_tasks)
    retain_items = _examples(adapter, read_items(retain, "retain"), retain_tasks)
    s = settings or default_settings(kind, progress)
    before = {"forget_nll": mean_nll(adapter, forget_items), "retain_nll": mean_nll(adapter, retain_items)}
    result = run_method(method, adapter, forget_items, retain_items, s, reference=base)
    edited = result.adapter
    after = {"forget_nll": mean_nll(edited, forget_items), "retain_nll": mean_nll(edited, retain_items)}
    report = {"method": method, "model_kind": kind, "model_dir": str(Path(model_dir).resolve()),
              "reference": str(Path(reference).resolve()) if reference is not None else None,
              "out": str(Path(out).resolve()) if out is not None else None, "where": where if kind != "speaker" else None,
              "forget_items": len(forget_items), "retain_items": len(retain_items),
              "extract_seconds": result.extract_seconds, "unlearn_seconds": result.unlearn_seconds,
              "changed_fraction": result.changed_fraction,
              "forget_nll": {"before": before["forget_nll"], "after": after["forget_nll"]},
              "retain_nll": {"before": before["retain_nll"], "after": after["retain_nll"]},
              "info": _jsonable(result.info), "settings": _jsonable(s)}
    if out is not None:
        _write(adapter, edited, result, method, Path(out), report, overwrite)
    return UnlearnResult(edited, Path(out) if out is not None else None, report)


def _write_json(path: Path, obj: Any) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2)
    os.replace(name, path)


def _write(adapter, edited, result, method: str, out: Path, report: dict, overwrite: bool) -> None:
    """The model in its own format (written atomically by its adapter), then the reports beside it."""
    from mmunlearn.erase import PATCH_NAME, REPORT_NAME as ERASE_REPORT

    out = adapter.save(out, overwrite=overwrite).resolve()  # the base weights as edited in place (t3: unchanged)
    if method == "t3":
        edited.model.save(out / "tilt")
        report["tilt_dir"] = str(out / "tilt")
    erase_report = result.info.get("report")
    if method in ERASE_METHODS and erase_report is not None:
        erase_report.patch_path = str(erase_report.patch.save(out / PATCH_NAME))
        erase_report.to_json(out / ERASE_REPORT)
        erase_report.plot_energy(out / "layer_energy.png")
        report["erase_report"] = str(out / ERASE_REPORT)
        report["undo_patch"] = erase_report.patch_path
    _write_json(out / REPORT_NAME, report)
