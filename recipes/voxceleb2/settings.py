"""Default settings of the VoxCeleb2 speaker-unlearning recipe, per speaker-model preset, and its sweep rule.

Every method unlearns a speaker *classifier* (the methods' ``speaker`` presets hold their settings): the
optimisation methods train with the model in eval mode (BatchNorm running statistics frozen); T3 and RMU do
not apply. Erasure task vectors are fine-tuning deltas of the original model on each partition (AdamW,
``steps`` x ``batch_size`` utterances), taken from a copy of the model, so the model being edited keeps its
BatchNorm statistics bit for bit. On the built-in corpus the forget task's energy sits in the embedding
head (MFA, attentive pooling, final projection), which QR-Erase's 1/|L| rule selects.

Sweep rule (``--sweep``), computed on the training partitions only -- never on the held-out
recordings, the holdout utterances or the retrained model. Candidates (rank x scale for erasure,
one per epoch for the baselines) are scored on the forget set and on the retain set the method
unlearns with; among those whose retain-set mean NLL rose by at most ``retain_bound`` nats the
rule takes the smallest edit that reaches the forget target (if none does, the one closest to it):

* speaker level -- forget measure: per forgotten speaker, the share of their training utterances predicted as none
  of the forget speakers (an utterance relabelled onto another forgotten speaker is not forgotten), the worst
  speaker's value (:func:`mmunlearn.eval.speaker.forgotten_error_rate`); target ``1 - 1/C`` (C classes), i.e.
  every forgotten speaker at or below one speaker's chance of "any forgotten speaker";
* sample level -- forget measure: the gap between the mean log-NLL of the forgotten utterances and
  that of the retain set, both under the model being edited (log-loss: the scale a loss-based
  membership attack ranks on, not dominated by a few outliers as the plain mean is); target 0:
  the forgotten utterances should look no more like training members than the data the model
  keeps. No training partition holds never-seen utterances, so this is the strongest target the
  training data alone supports; for a model that generalises well, kept training utterances and
  unseen ones score alike. The retain measure is the mean NLL, as at the speaker level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmunlearn.adapters.speaker.adapter import KIND as SPEAKER
from mmunlearn.adapters.speech_llm.adapter import KIND as SPEECH_LLM
from mmunlearn.audit.options import CAPABILITY_DEFAULTS, options_for
from mmunlearn.config import applicable_overrides
from mmunlearn.eval.speaker import forgotten_error_rate, score_rows
from mmunlearn.kinds import Kind, get_kind, kinds
from mmunlearn.methods import SweepRule, get, mean_nll, names, needing
from mmunlearn.methods.optimisation import budget_epochs

#: ``--model`` names a registered model kind that takes audio; ``classifier`` is the SpeechBrain ECAPA kind under the
#: name the recipe gave it before ``--model`` named kinds (its cache keys and default --out unprefixed).
MODEL_ALIASES = {"classifier": SPEAKER.name}


def model_kind(model: str) -> Kind:
    """The registered kind ``--model`` names (a ValueError listing :func:`models` when it names none)."""
    if model not in models():
        raise ValueError(f"model must be one of {', '.join(models())}, got {model!r}")
    return get_kind(MODEL_ALIASES.get(model, model))


def models() -> tuple[str, ...]:
    """Every ``--model`` value: the aliases (in place of their kinds' names), then each registered kind (plug-ins
    included) that takes audio and that the recipe can build: a classifier kind with a trainer
    (:attr:`~mmunlearn.kinds.Kind.trainer`) or a speech LLM (its own path, :mod:`recipes.voxceleb2.speech_llm`)."""
    built = [
        k.name
        for k in kinds()
        if k.takes_audio and (k.trainer is not None or not k.is_classifier) and k.name not in MODEL_ALIASES.values()
    ]
    return (*MODEL_ALIASES, *built)


#: Unlearning methods that apply to a classifier (T3 and RMU act on a language model).
CLASSIFIER_METHODS = tuple(names(SPEAKER.name))
#: Every method that applies to a speech LLM, in registry order.
SPEECH_LLM_METHODS = tuple(names(SPEECH_LLM.name))
#: Task-vector kinds that work on the speaker adapter (peft's LoRA cannot wrap ECAPA's cosine Classifier).
EXTRACT_KINDS = ("finetune", "gradient")
#: Layer selections of erasure (``EraseConfig.layer_rule``).
LAYER_RULES = ("mean", "top", "threshold", "all")
#: Methods that erase a subspace (their grid and scopes below apply).
ERASURE_METHODS = tuple(needing("task_vectors", SPEAKER.name))  # they declare it (mmunlearn.methods.NEEDS)


def is_erasure(method: str) -> bool:
    """Whether ``method`` erases a subspace of task vectors (it declares ``task_vectors`` among its needs): the
    scopes and the sweep grid below apply to it, also to one registered after this module was imported."""
    return "task_vectors" in get(method).needs


#: Erasure under ``--sweep`` on the classifier, unless the command line says otherwise: edit sizes relative to
#: the weights (0.001 ... 1.024 of their norm, then bisection), ranks 1, 2, 4, and task vectors from the
#: loss gradient. On FSDD fine-tuned (AdamW) task vectors of already-learned speakers were no use: AdamW moves
#: every weight by about lr per step whatever the data, so forget and retain vectors had the same layer
#: energies and erasing them left the forget speaker at 98-100 % up to edits of 40 % of the weights' norm.
SWEEP_ERASURE: dict[str, Any] = dict(sweep_scales="auto", sweep_ranks=(1, 2, 4), extract_kind="gradient")
#: ``--scope``: which weights erasure edits (:attr:`mmunlearn.adapters.speaker.adapter.SpeakerAdapter.scope`);
#: ``sweep`` lets the rule choose among these on the training partitions.
SCOPES = ("all", "head", "embedding", "sweep")
SWEEP_SCOPES = ("head", "embedding", "all")
#: Per scope, options unless given: the head's out space is one dimension per speaker, so a retain subspace
#: (rank >= the retained speakers) would hold the forget speaker's direction too and cancel the edit.
SCOPE_OPTIONS: dict[str, dict[str, Any]] = {"head": dict(retain_rank=0)}


def scopes_for(method: str, scope: str, sweep: bool) -> tuple[str, ...]:
    """The scopes ``method`` runs with for ``--scope scope``: ``sweep`` (the default with ``--sweep``) tries
    :data:`SWEEP_SCOPES` for the erasure methods; the optimisation baselines always train every weight."""
    if scope not in SCOPES:
        raise ValueError(f"--scope must be one of {SCOPES}, got {scope!r}")
    if not is_erasure(method):
        return ("all",)
    if scope == "sweep":
        if not sweep:
            raise ValueError("--scope sweep needs --sweep (the rule chooses the scope)")
        return SWEEP_SCOPES
    return (scope,)


def sweep_defaults(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`SWEEP_ERASURE` filled in where the command line left them unset (erasure only)."""
    if not is_erasure(method):
        return options
    filled = knobs_for(method, extract_kind=SWEEP_ERASURE["extract_kind"], sweep_ranks=SWEEP_ERASURE["sweep_ranks"])
    filled["sweep_scales"] = SWEEP_ERASURE["sweep_scales"]
    return {**filled, **options}


DEFAULT_RETAIN_BOUND = 0.05


def epoch_budget(method: str, preset: str, options: dict[str, Any], n_forget: int) -> int:
    """Under ``--sweep`` (epochs a cap; early stopping ends the run), an optimisation method's epochs: at least
    :data:`~mmunlearn.methods.optimisation.RULE_MIN_STEPS` optimizer steps on ``n_forget`` forget utterances."""
    return budget_epochs(get(method).config_for(SPEAKER.name, preset_kind(preset), **options), n_forget)


def preset_kind(preset: str) -> str:
    """Settings row of a model preset: ``tiny``, ``small``, or ``large`` (``base``/``large`` or a model dir; the
    speaker kind's rule, :meth:`mmunlearn.kinds.Kind.size_for`)."""
    return SPEAKER.size_for(preset)


def knobs_for(method: str, **values: Any) -> dict[str, Any]:
    """The CLI's overrides that ``method``'s config has (:func:`knobs`; its defaults per preset live in the config)."""
    return applicable_overrides(get(method).config, knobs(**values))


def knobs(
    *,
    rank: int | None = None,
    retain_rank: int | None = None,
    scale: float | None = None,
    extract_kind: str | None = None,
    extract_steps: int | None = None,
    extract_lr: float | None = None,
    lr: float | None = None,
    epochs: int | None = None,
    layer_rule: str | None = None,
    sweep_ranks: Sequence[int] | None = None,
    seed: int = 0,
    extract_kinds: Sequence[str] = EXTRACT_KINDS,
) -> dict[str, Any]:
    """The shared knobs of every method under their config names (a method takes those its config has).

    ``sweep_ranks``: the forget ranks a sweep tries (default: ``rank`` alone when given, else the
    preset's); ``layer_rule``: which layers erasure edits (mean, top, threshold, all); ``extract_kinds``: the
    task-vector kinds the model takes (default: the speaker classifier's, :data:`EXTRACT_KINDS`).
    """
    if extract_kind is not None and extract_kind not in extract_kinds:
        why = " does not work on the speaker classifier" if tuple(extract_kinds) == EXTRACT_KINDS else ""
        raise ValueError(f"task-vector kind {extract_kind!r}{why}; choose one of {tuple(extract_kinds)}")
    if layer_rule is not None and layer_rule not in LAYER_RULES:
        raise ValueError(f"layer rule {layer_rule!r}: choose one of {LAYER_RULES}")
    if sweep_ranks is not None and (not sweep_ranks or any(r < 1 for r in sweep_ranks)):
        raise ValueError(f"sweep ranks must be positive integers, got {sweep_ranks!r}")
    ranks = tuple(sweep_ranks) if sweep_ranks else (rank,) if rank else None
    return dict(
        rank=rank,
        retain_rank=retain_rank,
        scale=scale,
        extract_kind=extract_kind,
        extract_steps=extract_steps,
        extract_lr=extract_lr,
        extract_seed=seed,
        lr=lr,
        epochs=epochs,
        seed=seed,
        layer_rule=layer_rule,
        sweep_ranks=ranks,
    )


def parse_ranks(text: str | None) -> tuple[int, ...] | None:
    """``--sweep-ranks 1,2,4`` -> (1, 2, 4); None stays None."""
    if text is None:
        return None
    try:
        ranks = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--sweep-ranks must be a comma list of integers, got {text!r}") from None
    if not ranks or any(r < 1 for r in ranks):
        raise ValueError(f"--sweep-ranks must be positive integers, got {text!r}")
    return ranks


def parse_methods(methods: str) -> list[str]:
    """``all`` or a comma list of method names -> the list (validated)."""
    chosen = (
        list(CLASSIFIER_METHODS) if methods.strip() == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    )
    unknown = [m for m in chosen if m not in CLASSIFIER_METHODS]
    if unknown or not chosen:
        raise ValueError(
            f"unknown or inapplicable methods {unknown or methods!r}; choose from {list(CLASSIFIER_METHODS)} or 'all'"
        )
    return chosen


def mean_log_nll(adapter, items: Sequence[Mapping[str, Any]], batch_size: int = 16) -> float:
    """Mean over ``items`` of log(-log p(speaker | utterance)), in float64 (the sample-level sweep's forget
    measure; a trained classifier's NLLs are often below float32's resolution)."""
    import numpy as np

    nll = score_rows(adapter, items, batch_size=batch_size, desc=None).nll
    if np.isnan(nll).any():
        raise ValueError("mean_log_nll: some speakers of the items are not classes of the model")
    return float(np.mean(np.log(np.maximum(nll, 1e-300))))


class LogLossGap:
    """Sample-level forget measure: ``mean_log_nll(forget) - mean_log_nll(retain)`` under the current model."""

    __name__ = "log_loss_gap"

    def __init__(self, retain: Sequence[Mapping[str, Any]]):
        if not retain:
            raise ValueError("LogLossGap needs retain items")
        self.retain = list(retain)

    def __call__(self, adapter, items: Sequence[Mapping[str, Any]]) -> float:
        return mean_log_nll(adapter, items) - mean_log_nll(adapter, self.retain)


def sweep_rule(
    level: str,
    n_classes: int,
    retain: Sequence[Mapping[str, Any]],
    retain_bound: float = DEFAULT_RETAIN_BOUND,
    forget_acc: float | None = None,
) -> SweepRule:
    """The :class:`~mmunlearn.methods.rule.SweepRule` of ``level`` (see the module notes): forget/retain
    measures, the forget target and the retain bound. ``forget_acc`` (speaker level): the accuracy on the
    forget speakers' training utterances to reach (default: chance, ``1/n_classes``)."""
    if not retain_bound >= 0:
        raise ValueError(f"retain_bound must be >= 0 nats, got {retain_bound}")
    if forget_acc is not None and not 0.0 <= forget_acc < 1.0:
        raise ValueError(f"forget_acc must be in [0, 1), got {forget_acc}")
    if level == "speaker":
        target = 1.0 - (chance_accuracy(n_classes) if forget_acc is None else forget_acc)
        return SweepRule(
            forget_measure=forgotten_error_rate,
            forget_target=target,
            retain_measure=mean_nll,
            retain_bound=retain_bound,
        )
    if level == "sample":
        return SweepRule(
            forget_measure=LogLossGap(retain), forget_target=0.0, retain_measure=mean_nll, retain_bound=retain_bound
        )
    raise ValueError(f"level must be 'speaker' or 'sample', got {level!r}")


#: ``--audit`` relearning on a classifier unless the command line says otherwise (declared for every classifier kind
#: in :data:`mmunlearn.audit.options.CAPABILITY_DEFAULTS`, which ``mmunlearn audit`` reads too).
AUDIT_RELEARN: dict[str, Any] = CAPABILITY_DEFAULTS["is_classifier"]


def audit_options(kind: str = "speaker", **overrides: Any):
    """The audit settings of ``voxceleb2 speaker|sample --audit`` on a classifier of the registered ``kind``
    (``overrides``: the CLI's, None = default): the kind's defaults of :mod:`mmunlearn.audit.options`, the ones
    ``mmunlearn audit`` uses too."""
    return options_for(kind, **overrides)


def chance_accuracy(n_classes: int) -> float:
    """Accuracy of a uniform guess among ``n_classes`` speakers."""
    if n_classes < 1:
        raise ValueError(f"n_classes must be >= 1, got {n_classes}")
    return 1.0 / n_classes


__all__ = [
    "AUDIT_RELEARN",
    "MODEL_ALIASES",
    "model_kind",
    "models",
    "CLASSIFIER_METHODS",
    "ERASURE_METHODS",
    "is_erasure",
    "SCOPES",
    "SCOPE_OPTIONS",
    "SWEEP_ERASURE",
    "SWEEP_SCOPES",
    "scopes_for",
    "sweep_defaults",
    "DEFAULT_RETAIN_BOUND",
    "EXTRACT_KINDS",
    "LogLossGap",
    "audit_options",
    "chance_accuracy",
    "mean_log_nll",
    "knobs",
    "knobs_for",
    "parse_methods",
    "parse_ranks",
    "preset_kind",
    "sweep_rule",
]
