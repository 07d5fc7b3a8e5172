"""The entry point for a model a user brings: one call unlearns a forget set from a model folder of any registered kind.

``unlearn(model_dir, forget=..., retain=..., method="qr-erase", out=...)`` loads the folder by its kind
(:mod:`mmunlearn.kinds`: a text LLM or a speech LLM in ``save_pretrained`` layout, a SpeechBrain speaker classifier,
a Hugging Face audio classifier), reads the two sets in the formats users have (:mod:`mmunlearn.api.inputs`),
sweeps the method by the kind's rule (:mod:`mmunlearn.api.rules`; for a classifier also the scope,
:mod:`mmunlearn.api.scopes`), runs it through the harness (:mod:`mmunlearn.methods.harness`) and writes the edited
model to ``out`` in the format it was read from, plus ``unlearn_report.json`` and, for the methods that edit weights,
the undo patch (``mmunlearn restore`` gives the input back bit for bit). The input directory is never modified.

Example (a speaker classifier in SpeechBrain's layout and two (audio path, speaker) lists)::

    import mmunlearn

    result = mmunlearn.unlearn("models/ecapa_speakers", forget="forget.csv", retain="retain.csv",
                               method="qr-erase", out="models/ecapa_unlearned")
    print(result.report["verdict"])
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from mmunlearn.api.inputs import batch_of, check_labels, read_inputs, read_rows, spoken
from mmunlearn.api.rules import (
    SPEAKER_RETAIN_BOUND,
    NothingToForget,
    check_something_to_forget,
    speaker_rule,
    swept_overrides,
    text_rule,
)
from mmunlearn.api.scopes import run_scopes, scopes_to_try
from mmunlearn.api.text import Clock, choose_format
from mmunlearn.data.user.sets import split_held_out
from mmunlearn.files.paths import check_apart, check_holds_none
from mmunlearn.files.undo_store import default_undo_dir
from mmunlearn.kinds import Kind, kind_of, kinds
from mmunlearn.methods import get, needing
from mmunlearn.methods.harness import REPORT_NAME, Outcome
from mmunlearn.methods.optimisation import budget_epochs
from mmunlearn.methods.request import UnlearnRequest
from mmunlearn.methods.rule import span
from mmunlearn.requests import read_history, run_request
from mmunlearn.requests.state import obtain_retain_state

#: Share of a text LLM's retain rows set aside for the rule's retain measure (rows no method trains on).
TEXT_HOLD_OUT = 0.2
#: The method ``unlearn`` runs when none is named, by model kind (any kind not listed: :data:`FALLBACK_METHOD`). The
#: one place the default is chosen. Text LLMs: qr-erase-rows, the method whose released weights said the fewest of the
#: forget facts on a fine-tuned SmolLM2-135M-Instruct under the per-row rule (record byo_text_llm: 0 of 20, where npo
#: said 11, grad_diff 17 and qr-erase 18; it missed only the retain agreement bound there, 80 % of 90 %) and that meets
#: the rule on SmolLM2 TOFU with the real-checkpoint erasure default (record tofu_smollm2_erasure_default: utility
#: 0.99x the target's, retain rise +0.008); t3 said none too, but it is a serving filter that keeps the original
#: weights, so it never releases a model without the facts.
DEFAULT_METHOD: dict[str, str] = {"text": "qr-erase-rows"}
FALLBACK_METHOD = "qr-erase"


def default_method(kind: str) -> str:
    """The method :func:`unlearn` runs on a model of ``kind`` when none is named (:data:`DEFAULT_METHOD`)."""
    return DEFAULT_METHOD.get(kind, FALLBACK_METHOD)


@dataclass
class UnlearnResult:
    """The unlearned adapter (in memory), where it was written, and the report written beside it."""

    adapter: Any
    out: Path | None
    report: dict[str, Any]


def model_kind(model_dir: str | os.PathLike) -> str:
    """The registered kind (:mod:`mmunlearn.kinds`) of a model directory: ``text`` (a causal LM), ``speech-llm``,
    ``speaker`` (SpeechBrain layout) or ``hf-audio`` (a Hugging Face audio classifier)."""
    return _kind(model_dir).name


def _kind(model_dir: str | os.PathLike) -> Kind:
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    kind = kind_of(root)
    if kind is not None:
        return kind
    taken = "; ".join(k.description for k in kinds())
    raise ValueError(f"{root} is not a model folder mmunlearn reads (one of: {taken})")


def load_model(
    model_dir: str | os.PathLike,
    *,
    device: str = "auto",
    where: str = "both",
    trust_hparams: bool = False,
    scope: str = "all",
):
    """The adapter of a model directory of any kind (``where`` applies to speech LLMs; ``trust_hparams`` to
    SpeechBrain classifiers: True runs the code their ``hyperparams.yaml`` names, see the README; ``scope`` to
    classifiers: the weights erasure may edit, ``all``, ``head`` or ``embedding``)."""
    return _kind(model_dir).load(model_dir, device=device, where=where, trust_hparams=trust_hparams, scope=scope)


# long: public API whose signature and Args docstring take 46 lines; its per-scope closure reads a dozen of them
def unlearn(
    model_dir: str | os.PathLike,
    forget: Any,
    retain: Any,
    method: str | None = None,
    out: str | os.PathLike | None = None,
    *,
    reference: str | os.PathLike | None = None,
    where: str = "both",
    forget_tasks: Sequence[str] = ("speaker",),
    retain_tasks: Sequence[str] = ("speaker",),
    config: Any = None,
    size: str | None = None,
    rule: Any = "auto",
    device: str = "auto",
    overwrite: bool = False,
    progress: bool = True,
    trust_hparams: bool = False,
    retain_state: str | os.PathLike | None = None,
    refresh_retain: bool = False,
    batch: bool | None = None,
    compare_batch: bool = False,
    scope: str = "sweep",
    audio_dir: str | os.PathLike | None = None,
    undo: str | os.PathLike | None = None,
    prompt_format: str | None = None,
    forget_level: float | str | os.PathLike | None = None,
    **overrides: Any,
) -> UnlearnResult:
    """Unlearn ``forget`` from the model in ``model_dir`` and write the result to ``out``.

    Args:
        model_dir: a model folder of any registered kind: a text LLM or speech LLM (``save_pretrained``), a SpeechBrain
            speaker classifier (``hyperparams.yaml``), a Hugging Face audio classifier.
        forget / retain: text LLMs: question-answer rows or prompt-less text as a JSON, JSONL, CSV or ``.txt`` file, a
            list (dicts, pairs, strings) or a ``datasets.Dataset``; audio models: a manifest CSV, a ``path,label`` CSV,
            JSON/JSONL, a list of (audio path, speaker) pairs or rows, or a ``datasets.Dataset`` with an Audio column
            (docs/usage.md, "Accepted data formats"). A row in both sets is refused, and for speaker forgetting a
            speaker in both.
        method: a registered method (``mmunlearn.methods.names()``); ``t3`` and ``rmu`` need an LLM. None: the kind's
            default (:data:`DEFAULT_METHOD`: ``qr-erase-rows`` for a text LLM, else ``qr-erase``); the report names it.
        out: output folder (None: nothing is written; the adapter is returned), in the harness's layout. ``out`` may
            not be ``model_dir``, lie inside it or contain it; the input is never modified.
        reference: the model folder ``model_dir`` was fine-tuned from (same kind), when there is one: erasure takes
            task vectors from it, and an LLM's rule aims the forget NLL at its level. Never built for you.
        where: speech LLMs: erase/train in the ``audio`` tower, the ``text`` model, or ``both``.
        forget_tasks / retain_tasks: speech LLMs: the spoken questions asked of each set.
        config / size / overrides: the method's config; default its preset ``size`` for the model kind with
            ``overrides`` (e.g. ``rank=4, scale=16``).
        rule: ``"auto"`` (default): the kind's rule (:mod:`mmunlearn.api.rules`): classifiers, every forgotten
            speaker's clips predicted as none of the forget speakers on 98 % of them (near a retrained model's level;
            ``api.rules.SPEAKER_FORGET_TARGET``) with the retain NLL up at most 0.05 nats; text LLMs, row by row:
            every forget row's answer NLL at its level (``forget_level``, else the reference's NLL on the row, else
            its own + 1 nat, a guess) and no greedy answer to a forget question or paraphrase giving its answer, the
            retain NLL on held-out retain rows up at most 0.1 and 90 % of the original's held-out retain answers
            still said (:mod:`mmunlearn.api.row_rule`). A forget set the model never knew is refused
            (``NothingToForget``).
            A :class:`~mmunlearn.methods.rule.SweepRule` of your own, or None: the config as it is. The report's first
            field, ``verdict``, says "rule met", "RULE NOT MET" or "NOT CHECKED", naming each measure.
        scope: classifiers: the weights erasure edits -- ``sweep`` (default: the class rows first, every weight when
            they miss the rule; the rule's choice is kept), ``head``, ``all`` or ``embedding``.
        audio_dir: where audio held in a ``datasets.Dataset`` is written as WAV files (needed for such a dataset).
        undo: where the undo records go (default ``<out>.undo`` beside ``out``, readable by you only): ``out`` itself
            never holds the original weights, so it can be shipped; ``mmunlearn restore`` finds them through the
            report (``mmunlearn check-release out`` says whether a folder is ready to ship).
        prompt_format: text LLMs: how rows are written (``chat``: the tokenizer's chat template, ``plain``:
            ``Question: ...\\nAnswer: ...``, ``raw``: question + " " + answer, or a string with ``{question}`` and
            ``{answer}``); default the chat template when the tokenizer has one, else the one of ``plain`` / ``raw``
            under which the forget rows have the lowest NLL (the report's ``prompt_format`` says which and why).
        forget_level: text LLMs: the answer NLL every forget row must reach -- nats, or a model folder trained
            without the forget rows (a retrained-like model: its NLL on each row); default the reference's.
        retain_state / refresh_retain / batch / compare_batch / trust_hparams: deletion-request settings
            (``mmunlearn prepare-retain``; ``forget`` a list of set files is a batch edited once with their union;
            ``compare_batch`` needs a batch, ``refresh_retain`` a retain state, ``undo`` an ``out``).
    The settings are checked together (:class:`~mmunlearn.methods.request.UnlearnRequest`) before any model is loaded.
    A ``model_dir`` that is itself an unlearning output keeps its history (``undo_history/``); ``mmunlearn restore``
    undoes the latest request.
    Returns:
        :class:`UnlearnResult` with the adapter, ``out`` and the report (also ``out/unlearn_report.json``).
    """
    kind = _kind(model_dir)
    clock = Clock(3, progress)
    chosen_by = "given (method=)" if method is not None else "the default for the model kind (api.DEFAULT_METHOD)"
    method = method if method is not None else default_method(kind.name)
    get(method, kind.name)  # an unknown or inapplicable method fails before any model is loaded
    texts = not kind.takes_audio and not kind.is_classifier  # a text LLM: prompt formats, the row rule
    if not texts and (prompt_format is not None or forget_level is not None):
        raise ValueError(f"prompt_format / forget_level apply to text LLMs; {model_dir} is a {kind.name} model")
    history = read_history(model_dir)  # its undo records are checked (no link out, no hard link) before any work
    inputs = input_paths(model_dir, reference, forget, retain, history.undo)
    if out is not None:  # every input of every role, before anything is read or written
        for target in (out, undo if undo is not None else default_undo_dir(out)):
            check_apart(target, *inputs)
            if audio_dir is not None:  # the WAV files written there are inputs of the run
                check_holds_none(target, [Path(audio_dir) / "clip.wav"], f"audio_dir {audio_dir}")
    if reference is not None and model_kind(reference) != kind.name:
        raise ValueError(f"reference {reference} is a {model_kind(reference)} model, {model_dir} a {kind.name} model")
    batch = batch_of(forget) if batch is None else batch
    auto = isinstance(rule, str)
    if auto and rule != "auto":
        raise ValueError(f"rule must be a SweepRule, None or 'auto', got {rule!r}")
    # every setting checked here, before any model is loaded; each run fills in its rule, folder and report fields
    request = UnlearnRequest(
        method,
        kind.name,
        config=config,
        size=size,
        overrides=overrides,
        rule=None if auto else rule,
        out=out,
        inputs=inputs,
        overwrite=overwrite,
        undo_dir=undo,
        progress=progress,
        retain_state=retain_state,
        refresh_retain=refresh_retain,
        batch=batch,
        compare_batch=compare_batch,
    )
    data = read_inputs(
        kind,
        forget,
        retain,
        batch=batch,
        by_speaker=auto and kind.is_classifier,
        audio_dir=audio_dir,
        hold_out=TEXT_HOLD_OUT if auto and not kind.takes_audio else 0.0,
    )
    if not kind.takes_audio and (forget_tasks, retain_tasks) != (("speaker",), ("speaker",)):
        raise ValueError("forget_tasks / retain_tasks apply to speech LLMs (spoken questions about the clips)")
    scopes = scopes_to_try(scope, method, kind.is_classifier, swept=rule is not None and config is None)
    out = Path(out) if out is not None else None
    if out is not None and kind.takes_audio:  # the clips the rows name: writing --out or its undo must not delete them
        clips = [r["wav"] for r in [*data.forget_rows, *data.retain, *data.held_retain] if r.get("wav")]
        check_holds_none(out, clips, "audio clips of the forget/retain sets")
        check_holds_none(
            undo if undo is not None else default_undo_dir(out), clips, "audio clips of the forget/retain sets"
        )

    fmt: dict[str, Any] = {}  # a text LLM's prompt format, chosen on the first load (api.text.choose_format)

    def load(s: str, folder: Any = model_dir):
        adapter = load_model(folder, device=device, where=where, trust_hparams=trust_hparams, scope=s)
        if fmt:
            adapter.set_prompt_format(fmt["format"])
        return adapter

    bases: dict[str, Any] = {}
    checked: dict[str, Any] = {"method_chosen_by": chosen_by}
    asks = kind.takes_audio and not kind.is_classifier  # a speech LLM answers spoken questions about the clips

    def run_one(s: str, folder: Path | None, staged: bool) -> Outcome:
        adapter = load(s)
        if texts and not fmt:
            fmt.update(choose_format(adapter, data.forget_rows, prompt_format))
        if kind.is_classifier:  # every label a class of the model, checked before any work
            check_labels(data.forget_rows, adapter.speakers, "forget")
            check_labels(data.retain, adapter.speakers, "retain")
        if reference is not None and s not in bases:
            bases[s] = load(s, reference)
        base = bases.get(s)
        level = load(s, forget_level) if isinstance(forget_level, (str, os.PathLike)) else forget_level
        first = checked.setdefault("runs", 0) == 0  # a classifier's scope sweep runs again: its stages said once
        checked["runs"] += 1
        if first:
            clock.done(
                "model loaded" + (f", prompt format {fmt['format']!r}" if fmt else ""),
                "setting up the rule (scoring the forget rows; greedy answers for a text LLM)",
            )
        items = (
            [spoken(asks, f, forget_tasks) for f in data.forget] if batch else spoken(asks, data.forget, forget_tasks)
        )
        flat = [r for f in items for r in f] if batch else items
        the_rule, extra = _rule(rule, kind, adapter, flat, data.held_retain, base, request, s, checked, level)
        if first:
            clock.done(
                "rule set up" if the_rule is not None else "no rule",
                f"the {method} run (its lines below say its elapsed time and, from its first sweep point or "
                f"step, the most time left), then the final check and the write (about "
                f"{span(clock.since())}: the rule's scoring again)",
            )
        meta = {
            "model_dir": str(Path(model_dir).resolve()),
            "method_chosen_by": checked["method_chosen_by"],
            "prompt_format": dict(fmt) or None,
            "forget_level": forget_level
            if not isinstance(forget_level, (str, os.PathLike))
            else str(Path(forget_level).resolve()),
            "reference": str(Path(reference).resolve()) if reference is not None else None,
            "where": where if asks else None,
            "scope": s if kind.is_classifier else None,
            "knowledge_check": checked.get("check"),
            "rule_target": checked.get("target_source"),
            "held_retain_items": len(data.held_retain),
        }
        this = replace(
            request,
            overrides=extra,
            rule=the_rule,
            out=folder,
            meta=meta,
            undo_dir=None if staged else request.undo_dir,
        )
        return run_request(
            this,
            adapter,
            items,
            spoken(asks, data.retain, retain_tasks),
            reference=base,
            history=history,
            clone=lambda: load(s),
        )

    outcome = run_scopes(run_one, scopes, out, inputs, overwrite, undo)
    clock.done(f"unlearned by {method}, judged" + (f" and written to {outcome.out}" if outcome.out else ""), "nothing")
    if progress and outcome.report["target_reached"] is not False:  # a missed rule is logged as a warning already
        print(outcome.report["verdict"], file=sys.stderr)
    if progress and "release" in outcome.report:  # T3: say where the user decides what to ship
        print(outcome.report["release"], file=sys.stderr)
    return UnlearnResult(outcome.adapter, outcome.out, outcome.report)


def input_paths(model_dir: Any, reference: Any, forget: Any, retain: Any, own_undo: Any = None) -> list[Any]:
    """Every path an :func:`unlearn` call reads that ``out`` and the undo folder may not be, lie in or contain: the
    model, the reference, the forget and retain set files (a batch's too) and the model's own undo folder."""
    found = [model_dir, reference, own_undo]
    for given in (forget, retain):
        if isinstance(given, (str, os.PathLike)):
            found.append(given)
        elif isinstance(given, (list, tuple)):
            found.extend(g for g in given if isinstance(g, (str, os.PathLike)))
    return [f for f in found if f is not None]


def _rule(
    rule: Any,
    kind: Kind,
    adapter,
    forget: list,
    held_retain: list,
    base,
    request: UnlearnRequest,
    scope: str,
    checked: dict[str, Any],
    level: Any = None,
):
    """(the rule, the method's overrides) of one run of ``request``. ``rule="auto"``: a classifier gets the speaker
    rule, the sweep settings and a step budget; a text LLM the row rule (:func:`~mmunlearn.api.rules.text_rule`); a
    speech LLM none (pass a SweepRule); the first run checks that the model knows the forget set
    (:class:`NothingToForget`)."""
    method, overrides = request.method, request.overrides
    if not isinstance(rule, str):
        return rule, dict(overrides)
    if kind.is_classifier:
        the_rule = speaker_rule(len(adapter.speakers))
        checked.setdefault(
            "target_source",
            "near a model retrained without the forget speakers "
            f"({the_rule.forget_target:g} of their clips named as another class)",
        )
    elif not kind.takes_audio:
        the_rule, source = text_rule(adapter, forget, reference=base, level=level, held_retain=held_retain)
        checked.setdefault("target_source", source)
    else:
        return None, dict(overrides)
    if "check" not in checked:
        checked["check"] = check_something_to_forget(
            adapter,
            forget,
            the_rule,
            classifier=kind.is_classifier,
            reference_given=base is not None or level is not None,
        )
    extra = dict(overrides)
    if kind.is_classifier and request.config is None:
        extra = {**swept_overrides(method, scope), **extra}
        if "epochs" not in extra and "epochs" in {f.name for f in fields(get(method).config)}:
            extra["epochs"] = budget_epochs(get(method).config_for(kind.name, request.size, **extra), len(forget))
    return the_rule, extra


def prepare_retain(
    model_dir: str | os.PathLike,
    retain: Any,
    out: str | os.PathLike,
    *,
    method: str = "qr-erase",
    reference: str | os.PathLike | None = None,
    where: str = "both",
    retain_tasks: Sequence[str] = ("speaker",),
    size: str | None = None,
    device: str = "auto",
    refresh: bool = False,
    progress: bool = True,
    trust_hparams: bool = False,
    scope: str = "all",
    prompt_format: str | None = None,
    **extract: Any,
) -> Any:
    """Compute the retain side of an erasure method once and store it in ``out`` (``mmunlearn prepare-retain``).

    ``retain`` as for :func:`unlearn`; the task vectors come from ``reference`` when given, else from the
    model (as :func:`unlearn` takes them). ``extract`` overrides the method preset's extraction settings
    (``kind``, ``steps``, ``lr``, ``batch_size``, ...); ``scope`` as for :func:`unlearn`. ``prompt_format``: text
    LLMs, the format the retain rows are written in, as for :func:`unlearn`; default the chat template when the
    tokenizer has one, else the one of ``plain`` / ``raw`` under which the model's retain rows have the lowest NLL
    (give the same format to both calls when it has no template: :func:`unlearn` chooses on the forget rows). The
    state records its format, and a run in another format recomputes it. A text LLM's state covers the retain rows
    :func:`unlearn`'s default rule trains on (it sets :data:`TEXT_HOLD_OUT` of them aside, the same ones, to score
    on; a run with ``rule=None`` or a rule of your own trains on all of them and recomputes the state). A matching
    state already in ``out`` is kept
    (``refresh=True`` recomputes). Returns the :class:`~mmunlearn.requests.state.RetainState`; its
    ``status`` says whether it was loaded, computed or recomputed, and ``reason`` why.
    """
    kind_obj = _kind(model_dir)
    kind = kind_obj.name
    spec = get(method, kind)
    cfg = spec.config_for(kind, size)
    if "task_vectors" not in spec.needs:
        raise ValueError(
            f"a retain state applies to the methods that work from task vectors "
            f"({', '.join(needing('task_vectors'))}), not to {method}"
        )
    if reference is not None and model_kind(reference) != kind:
        raise ValueError(f"reference {reference} is a {model_kind(reference)} model, {model_dir} a {kind} model")
    texts = not kind_obj.takes_audio and not kind_obj.is_classifier
    if not texts and prompt_format is not None:
        raise ValueError(f"prompt_format applies to text LLMs; {model_dir} is a {kind} model")
    settings = replace(cfg.extract, **{k: v for k, v in extract.items() if v is not None})
    inputs = input_paths(model_dir, reference, None, retain)  # out may not hold the retain files either
    check_apart(out, *inputs)  # before the model is loaded
    rows = read_rows(kind_obj, retain, "retain")
    chooses = reference is None or (texts and prompt_format is None)  # the format chosen on the model, as unlearn
    source = load_model(
        model_dir if chooses else reference, device=device, where=where, trust_hparams=trust_hparams, scope=scope
    )
    note = None
    if texts:
        fmt = choose_format(source, rows, prompt_format, which="retain")
        note = {"prompt_format_chosen_by": fmt["chosen_by"]}
    if reference is not None and chooses:
        del source  # one model in memory at a time
        source = load_model(reference, device=device, where=where, trust_hparams=trust_hparams, scope=scope)
        if texts:
            source.set_prompt_format(fmt["format"])
    if texts:  # the rows unlearn's default rule trains on: it sets TEXT_HOLD_OUT of them aside to score on
        fit, held = split_held_out(rows, fraction=TEXT_HOLD_OUT)
        rows = fit if held else rows
    items = spoken(kind_obj.takes_audio and not kind_obj.is_classifier, rows, retain_tasks)
    return obtain_retain_state(
        out, source, items, settings, kind=kind, refresh=refresh, progress=progress, inputs=inputs, note=note
    )


__all__ = [
    "DEFAULT_METHOD",
    "NothingToForget",
    "REPORT_NAME",
    "SPEAKER_RETAIN_BOUND",
    "UnlearnResult",
    "batch_of",
    "default_method",
    "load_model",
    "model_kind",
    "prepare_retain",
    "speaker_rule",
    "swept_overrides",
    "unlearn",
]
