"""The voice-pipeline entry point: one call unlearns speakers (or utterances) from a speech model on disk.

``unlearn(model_dir, forget=..., retain=..., method="qr-erase", out=...)`` loads either kind of speech
model, a speaker classifier in SpeechBrain's ``EncoderClassifier`` layout (``hyperparams.yaml``) or a
speech LLM in ``save_pretrained`` layout (Qwen2-Audio, Qwen2.5-Omni, Qwen3-Omni), runs an unlearning
method through the harness (:mod:`mmunlearn.methods.harness`) and writes the edited model to ``out`` in
the format it was read from, plus ``unlearn_report.json`` and, for the methods that edit weights, the
undo patch (``mmunlearn restore`` gives the input back bit for bit). The input directory is never modified.

``forget`` / ``retain`` are each a manifest CSV (``ID,duration,wav,start,stop,spk_id[,gender,text]``),
a list of manifest rows, or a list of ``(audio path, label)`` pairs (label: the speaker ID). For a
speech LLM the rows become spoken questions (:mod:`mmunlearn.speech.spoken_qa`): the forget set asks
``forget_tasks`` (default: "Who is speaking?"), the retain set ``retain_tasks`` (default the same;
add ``"gender"`` to protect the gender answer on the same audio).

Example, on the built-in synthetic corpus (the recipe's helpers build the corpus and a trained ``mini``
speech LLM, cached; ``reference`` is the model it was fine-tuned from)::

    import mmunlearn
    from recipes.voxceleb2_speech_llm import build_model, make_corpus

    man = make_corpus("corpus")  # 10 espeak speakers in the VoxCeleb2 layout, 2 to forget, and manifests
    target, base = (build_model(man, preset="mini", role=r) for r in ("target", "base"))
    result = mmunlearn.unlearn(target, forget=man / "spk_forget_train.csv", retain=man / "spk_retain_train.csv",
                               method="qr-erase", out="unlearned-speech-llm", reference=base,
                               retain_tasks=("speaker", "gender"), size="mini")
    print(result.report["forget_nll"], result.report["retain_nll"])
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mmunlearn.adapters.speech_llm import SpeechLLMAdapter
from mmunlearn.data.manifest import check_rows, read_manifest
from mmunlearn.eval.speaker import forgotten_error_rate
from mmunlearn.kinds import Kind, get_kind, kind_of, kinds
from mmunlearn.methods import SweepRule, get, mean_nll, needing
from mmunlearn.methods.harness import REPORT_NAME
from mmunlearn.methods.optimisation import budget_epochs
from mmunlearn.requests import read_history, run_request
from mmunlearn.requests.state import obtain_retain_state
from mmunlearn.speech.spoken_qa import spoken_qa


@dataclass
class UnlearnResult:
    """The unlearned adapter (in memory), where it was written, and the report written beside it."""

    adapter: Any
    out: Path | None
    report: dict[str, Any]


def model_kind(model_dir: str | os.PathLike) -> str:
    """The registered kind (:mod:`mmunlearn.kinds`) of a speech model directory: ``speaker`` (SpeechBrain layout),
    ``hf-audio`` (a Hugging Face audio classifier) or ``speech-llm`` (a supported speech LLM)."""
    return _speech_kind(model_dir).name


def _speech_kind(model_dir: str | os.PathLike) -> Kind:
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    kind = kind_of(root)
    if kind is not None and kind.takes_audio:
        return kind
    taken = " nor a ".join(k.description for k in kinds() if k.takes_audio)
    found = f" (it is a {kind.description})" if kind is not None else ""
    raise ValueError(f"{root} is neither a {taken}{found}")


def load_model(model_dir: str | os.PathLike, *, device: str = "auto", where: str = "both",
               trust_hparams: bool = False, scope: str = "all"):
    """The adapter of a speech model directory of any kind (``where`` applies to speech LLMs; ``trust_hparams``
    and ``scope`` to speaker classifiers: True runs the code their ``hyperparams.yaml`` names, see the README;
    ``scope`` is :attr:`~mmunlearn.adapters.speaker.SpeakerAdapter.scope`, the weights erasure may edit)."""
    return _speech_kind(model_dir).load(model_dir, device=device, where=where, trust_hparams=trust_hparams,
                                        scope=scope)


def read_items(source: str | os.PathLike | Sequence[Any], name: str) -> list[dict[str, Any]]:
    """Manifest rows from a CSV path, a list of rows (dicts), or a list of (audio path, label) pairs."""
    if isinstance(source, (str, os.PathLike)):
        return read_manifest(source, check_files=True)  # every row checked before any work
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
    check_rows(rows, name, required=("wav", "spk_id"))
    return rows


def _examples(adapter, rows: list[dict[str, Any]], tasks: Sequence[str]) -> list[dict[str, Any]]:
    if not isinstance(adapter, SpeechLLMAdapter):
        return rows
    if all("question" in r and "answer" in r for r in rows):
        return rows  # already spoken-QA examples
    return spoken_qa(rows, tasks)


def unlearn(model_dir: str | os.PathLike, forget: Any, retain: Any, method: str = "qr-erase",
            out: str | os.PathLike | None = None, *, reference: str | os.PathLike | None = None, where: str = "both",
            forget_tasks: Sequence[str] = ("speaker",), retain_tasks: Sequence[str] = ("speaker",),
            config: Any = None, size: str | None = None, rule: Any = "auto", device: str = "auto",
            overwrite: bool = False, progress: bool = True, trust_hparams: bool = False,
            retain_state: str | os.PathLike | None = None, refresh_retain: bool = False, batch: bool | None = None,
            compare_batch: bool = False, scope: str = "all", **overrides: Any) -> UnlearnResult:
    """Unlearn ``forget`` from the speech model in ``model_dir`` and write the result to ``out``.

    Args:
        model_dir: a speaker-classifier directory (SpeechBrain layout) or a speech-LLM directory.
        forget / retain: manifest CSV, list of manifest rows, or list of (audio path, speaker label).
        method: a registered method (``mmunlearn.methods.names()``: ``qr-erase``, ``qr-erase-rows``,
            ``svd-unlearn``, ``grad_ascent``, ``grad_diff``, ``kl``, ``npo``, ``simnpo``, ``t3``, ``rmu``);
            ``t3`` and ``rmu`` need a speech LLM.
        out: output folder (None: nothing is written; the adapter is returned), in the harness's layout
            (:mod:`mmunlearn.methods.harness`): the model in its input format, ``unlearn_report.json``, and
            the undo patch for the methods that edit weights. ``out`` may not be ``model_dir``, lie inside
            it or contain it; the input is never modified.
        reference: the model directory ``model_dir`` was fine-tuned from (same kind and layout), when
            there is one: the erasure methods take task vectors from it (default: the model itself; for a
            speaker classifier a copy of it, so its BatchNorm statistics stay untouched).
        where: speech LLMs: erase/train in the ``audio`` tower, the ``text`` model, or ``both``.
        forget_tasks / retain_tasks: speech LLMs: the spoken questions asked of each set.
        config / size / overrides: the method's config; default its preset ``size`` for the model kind
            (the kind's ``default_size``, :mod:`mmunlearn.kinds`) with ``overrides`` (e.g. ``rank=4, scale=16``).
        rule: ``"auto"`` (default): for a speaker classifier the documented speaker rule (:func:`speaker_rule`: every
            forgotten speaker's utterances predicted as none of the forget speakers up to ``1 - 1/C``, measured per
            speaker and met by the worst one; on a model that earlier requests edited, the speakers they forgot
            (its history's ``forget_speakers``) count as forget speakers too; the retain NLL rising by at most 0.05 nats; erasure sweeps scale and
            rank with gradient task vectors, the baselines get at least 100 optimizer steps, unless
            ``config``/``overrides`` say otherwise), for a speech LLM None; a
            :class:`~mmunlearn.methods.rule.SweepRule` of your own; None: the config as it is (the presets alone
            rarely forget a speaker). The report's first field, ``verdict``, says "rule met", "RULE NOT MET" (with
            the numbers) or "NOT CHECKED", and the call prints it when ``progress`` is on.
        trust_hparams: speaker classifiers: load ``hyperparams.yaml`` with HyperPyYAML, which runs the code it
            names (default False: parsed as data against an allow-list of classes; see the README).
        retain_state: erasure methods: a folder for the retain side (``mmunlearn prepare-retain`` writes it).
            Loaded when its fingerprints (weights, retain data, extraction settings) match, else computed and
            written there; the report says which (``retain_state``). Only the forget side is then extracted.
        refresh_retain: recompute the retain state even when it matches.
        batch: ``forget`` is a list of forget sets (default: detected for a list of ``.csv`` manifest paths), edited
            once with their union; ``compare_batch`` also applies them one by one to a fresh copy and
            reports the difference (``report["batch"]["one_by_one"]``).
        scope: speaker classifiers: the weights erasure extracts from and edits -- ``all``, ``embedding``, or
            ``head`` (the class weights; embeddings, hence verification, stay bit for bit, and scoring reuses
            the embeddings, which makes a swept request several times cheaper). With ``head`` pass
            ``retain_rank=0``: a retain subspace of the head spans the forget speaker's direction too.
    A ``model_dir`` that is itself an unlearning output keeps its history: the new output carries the earlier
    requests' undo patches (``undo_history/``) and the report lists every request (``requests``); ``mmunlearn
    restore`` undoes the latest one and gives the folder the request before it wrote.
    Returns:
        :class:`UnlearnResult` with the adapter, ``out`` and the report (also ``out/unlearn_report.json``).
    """
    kind = model_kind(model_dir)
    get(method, kind)  # an unknown or inapplicable method fails before any model is loaded
    history = read_history(model_dir)  # its undo records are checked (no link out, no hard link) before any work
    if reference is not None and model_kind(reference) != kind:
        raise ValueError(f"reference {reference} is a {model_kind(reference)} model, {model_dir} a {kind} model")
    adapter = load_model(model_dir, device=device, where=where, trust_hparams=trust_hparams, scope=scope)
    if isinstance(rule, str):
        if rule != "auto":
            raise ValueError(f"rule must be a SweepRule, None or 'auto', got {rule!r}")
        rule = speaker_rule(len(adapter.speakers)) if get_kind(kind).is_classifier else None
        if rule is not None and config is None:
            overrides = {**swept_overrides(method, scope), **overrides}
            if "epochs" not in overrides and "epochs" in {f.name for f in fields(get(method).config)}:
                n_forget = len(read_items(forget, "forget")) if not batch_of(forget) else sum(
                    len(read_items(f, "forget")) for f in forget)
                overrides["epochs"] = budget_epochs(get(method).config_for(kind, size, **overrides), n_forget)
    base = (load_model(reference, device=device, where=where, trust_hparams=trust_hparams, scope=scope)
            if reference is not None else None)
    if batch is None:
        batch = batch_of(forget)
    if batch:
        forget_items = [_examples(adapter, read_items(f, f"forget set {i}"), forget_tasks) for i, f in enumerate(forget)]
    else:
        forget_items = _examples(adapter, read_items(forget, "forget"), forget_tasks)
    retain_items = _examples(adapter, read_items(retain, "retain"), retain_tasks)
    inputs = [model_dir] + ([reference] if reference is not None else [])
    meta = {"model_dir": str(Path(model_dir).resolve()),
            "reference": str(Path(reference).resolve()) if reference is not None else None,
            "where": where if not get_kind(kind).is_classifier else None,
            "scope": scope if get_kind(kind).is_classifier else None}
    outcome = run_request(adapter, forget_items, retain_items, kind=kind, method=method, config=config, size=size,
                          overrides=overrides, reference=base, rule=rule, out=out, inputs=inputs, overwrite=overwrite,
                          progress=progress, meta=meta, retain_state=retain_state, refresh_retain=refresh_retain,
                          history=history, batch=batch, compare_batch=compare_batch,
                          clone=lambda: load_model(model_dir, device=device, where=where, trust_hparams=trust_hparams,
                                                   scope=scope))
    if progress and outcome.report["target_reached"] is not False:  # a missed rule is logged as a warning already
        print(outcome.report["verdict"], file=sys.stderr)
    return UnlearnResult(outcome.adapter, outcome.out, outcome.report)


def batch_of(forget: Any) -> bool:
    """Whether ``forget`` is a list of forget-set manifests (``.csv`` paths): a batch of requests."""
    return (isinstance(forget, (list, tuple)) and bool(forget)
            and all(isinstance(f, (str, os.PathLike)) and os.fspath(f).lower().endswith(".csv") for f in forget))


#: The speaker rule's bound on the retain set's mean NLL rise (nats), as the VoxCeleb2 recipe's default.
SPEAKER_RETAIN_BOUND = 0.05


def speaker_rule(n_classes: int, retain_bound: float = SPEAKER_RETAIN_BOUND) -> Any:
    """The documented speaker-level sweep rule for a classifier of ``n_classes`` speakers: forget measure the share
    of the forget utterances predicted as none of the forget speakers, target ``1 - 1/n_classes`` (chance), retain
    measure the mean NLL, rising by at most ``retain_bound`` nats. A request on an edited model widens it to the
    speakers earlier requests forgot (:func:`mmunlearn.requests.widened_rule`)."""
    if n_classes < 2:
        raise ValueError(f"a speaker rule needs >= 2 classes, got {n_classes}")
    return SweepRule(forget_target=1.0 - 1.0 / n_classes, retain_bound=retain_bound,
                     forget_measure=forgotten_error_rate, retain_measure=mean_nll)


def swept_overrides(method: str, scope: str = "all") -> dict[str, Any]:
    """What a rule-driven run of ``method`` on a speaker classifier uses unless told otherwise: erasure sweeps
    edit sizes relative to the weights (``sweep_scales="auto"``), ranks 1, 2, 4, with gradient task vectors (the
    recipe's ``--sweep`` settings); in the head scope no retain subspace (it would hold the forget direction)."""
    if "task_vectors" not in get(method).needs:  # the sweep grid below is the task-vector methods'
        return {}
    return {"sweep_scales": "auto", "sweep_ranks": (1, 2, 4), "extract_kind": "gradient",
            **({"retain_rank": 0} if scope == "head" else {})}


def prepare_retain(model_dir: str | os.PathLike, retain: Any, out: str | os.PathLike, *, method: str = "qr-erase",
                   reference: str | os.PathLike | None = None, where: str = "both",
                   retain_tasks: Sequence[str] = ("speaker",), size: str | None = None, device: str = "auto",
                   refresh: bool = False, progress: bool = True, trust_hparams: bool = False, scope: str = "all",
                   **extract: Any) -> Any:
    """Compute the retain side of an erasure method once and store it in ``out`` (``mmunlearn prepare-retain``).

    ``retain`` as for :func:`unlearn`; the task vectors come from ``reference`` when given, else from the
    model (as :func:`unlearn` takes them). ``extract`` overrides the method preset's extraction settings
    (``kind``, ``steps``, ``lr``, ``batch_size``, ...); ``scope`` as for :func:`unlearn`. A matching state already in ``out`` is kept
    (``refresh=True`` recomputes). Returns the :class:`~mmunlearn.requests.state.RetainState`; its
    ``status`` says whether it was loaded, computed or recomputed, and ``reason`` why.
    """
    from dataclasses import replace

    kind = model_kind(model_dir)
    spec = get(method, kind)
    cfg = spec.config_for(kind, size)
    if "task_vectors" not in spec.needs:
        raise ValueError(f"a retain state applies to the methods that work from task vectors "
                         f"({', '.join(needing('task_vectors'))}), not to {method}")
    if reference is not None and model_kind(reference) != kind:
        raise ValueError(f"reference {reference} is a {model_kind(reference)} model, {model_dir} a {kind} model")
    settings = replace(cfg.extract, **{k: v for k, v in extract.items() if v is not None})
    source = load_model(reference if reference is not None else model_dir, device=device, where=where,
                        trust_hparams=trust_hparams, scope=scope)
    items = _examples(source, read_items(retain, "retain"), retain_tasks)
    inputs = [model_dir] + ([reference] if reference is not None else [])
    return obtain_retain_state(out, source, items, settings, kind=kind, refresh=refresh, progress=progress,
                               inputs=inputs)
