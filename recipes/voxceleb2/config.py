"""The VoxCeleb2 recipe's settings as one config dataclass in three layers over every benchmark's
(:class:`recipes.recipe_config.BenchmarkSettings`): :class:`SpeakerBenchmarkSettings` (what every run shares: data,
the sweep rule, evaluation, the model kind),
:class:`ClassifierSettings` (the classifier models' size, training and erasure scope) and
:class:`SpeechLLMSettings` (the ``--model speech-llm`` options); :class:`VoxCelebConfig` is the whole config of
``voxceleb2 speaker|sample``, checked together. The commands take one whole (:mod:`recipes.recipe_cli`: options,
``--config FILE.yaml``, ``key=value``, ``--method-option``); every check raises a
:class:`~recipes.recipe_config.ConfigError` naming the setting, before any work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mmunlearn.api.rules import NLL_RETAIN_BOUND
from mmunlearn.audit import ATTACKS
from mmunlearn.audit.options import parse_list
from mmunlearn.config import applicable_overrides, opt
from mmunlearn.kinds import Kind
from mmunlearn.methods import get, names
from mmunlearn.taskvec.extract import KINDS as EXTRACT_KINDS
from recipes.recipe_config import BenchmarkSettings, ConfigError, with_default
from recipes.voxceleb2 import settings

WHERE = ("audio", "text", "both")
TARGETS = ("gender", "transcript")
#: Settings the speech-LLM path has no use for (a classifier's models, evaluation, scopes and audit; its rule is the
#: NLL rule): refused there when set, with why.
CLASSIFIER_ONLY = {
    "preset": "the speech LLM is --llm",
    "train_epochs": "the speech LLM's training is its preset's",
    "train_lr": "the speech LLM's training is its preset's",
    "crop_seconds": "the speech LLM hears whole utterances",
    "scope": "the speech LLM's edits are chosen by --where",
    "forget_acc": "the speech LLM's rule is on the forget NLL",
    "segment_seconds": "the speech LLM is scored on whole utterances",
    "max_trials": "the speech LLM has no verification trials",
    "audit_relearn_steps": "--audit runs on the classifier",
    "audit_relearn_lr": "--audit runs on the classifier",
    "audit_relearn_on": "--audit runs on the classifier",
    "audit_attacks": "--audit runs on the classifier",
}
#: Settings of the speech LLM alone: refused on a classifier when set.
SPEECH_LLM_ONLY = ("llm", "where", "keep_task", "reference", "retrained")
DEFAULT_WORKDIR = Path("runs/voxceleb2")


@dataclass(frozen=True)
class SpeakerBenchmarkSettings(BenchmarkSettings):
    """Settings every speaker-forgetting run shares beside every benchmark's (:class:`BenchmarkSettings`): data, the
    sweep rule, erasure's retain side, evaluation and the model kind."""

    methods: tuple[str, ...] = with_default(BenchmarkSettings, "methods", ("qr-erase",))
    manifests: Path | None = opt(
        None,
        "Manifest folder written by `prepare`; default: the built-in corpus under "
        "--workdir (synthesised and prepared on first use).",
    )
    workdir: Path = opt(
        DEFAULT_WORKDIR,
        "Built-in corpus (corpus/), its manifests (manifests/), trained models (models/) and, by default, results.",
    )
    speakers: int = opt(20, "Built-in corpus: number of speakers (at least 2).")
    utterances: int = opt(30, "Built-in corpus: utterances per speaker (at least 2).")
    videos: int = opt(
        3,
        "Built-in corpus: videos (recording sessions) per speaker (at least 2); one in five (at "
        "least one) is held out for testing.",
    )
    forget_speakers: int = opt(2, "Built-in corpus: speakers to forget (speaker level), drawn by --seed.")
    forget_fraction: float = opt(
        0.1,
        "Built-in corpus: fraction (0 to 0.5) of each kept speaker's training "
        "utterances to forget (sample level); as many become the never-trained holdout.",
    )
    sweep: bool = with_default(BenchmarkSettings, "sweep", True)  # the presets alone do not forget
    strict: bool = opt(
        False,
        "With --sweep: exit with status 1 when a method's sweep did not meet its rule (the tables are written first).",
    )
    retain_bound: float | None = opt(
        None,
        "Sweep rule: largest allowed rise of the retain set's mean NLL (nats; "
        f"default {settings.DEFAULT_RETAIN_BOUND:g} on a classifier, "
        f"{NLL_RETAIN_BOUND:g} on a speech LLM).",
    )
    forget_acc: float | None = opt(
        None,
        "Sweep rule, speaker level: accuracy (0 to 0.99) on the forget speakers' "
        "training utterances to reach (default: chance, 1/classes).",
    )
    retain_rank: int | None = opt(None, "Erasure: retain rank per matrix (capped at each matrix's size).")
    extract_lr: float | None = opt(None, "Erasure: task-vector learning rate (gradient: step size).")
    segment_seconds: float | None = opt(
        None, "Evaluation: average logits/embeddings over windows of this many seconds (default: whole utterances)."
    )
    max_trials: int = opt(20000, "Evaluation: at most this many verification trials, drawn by --seed (0: all pairs).")
    model: str = opt(
        "classifier",
        "The model kind: classifier (ECAPA-TDNN speaker classifier), hf-audio (a small "
        "wav2vec2-style transformers AutoModelForAudioClassification built from a local "
        "config, never downloaded; --preset sizes it; --scope as for ECAPA; each method's "
        "<out>/<method>/model is a save_pretrained folder that "
        "transformers.pipeline('audio-classification') loads; default --out: "
        "--workdir/hf-audio/<level>), speech-llm (Qwen-Omni-style model answering 'who is "
        "speaking?'; adds t3 and rmu to the methods), or any installed classifier kind "
        "whose adapter names a trainer (mmunlearn.kinds.Kind.trainer).",
    )


@dataclass(frozen=True)
class ClassifierSettings(SpeakerBenchmarkSettings):
    """Settings of the classifier models (--model classifier or hf-audio): size, training, erasure layers and scope."""

    preset: str = opt(
        "small",
        "Classifier size: tiny (tests), small (CPU demo), base or large (ECAPA sizes of "
        "SpeechBrain); with --model hf-audio: tiny, small or large wav2vec2 configs "
        "(mmunlearn/adapters/hf_audio/training.py).",
    )
    train_epochs: int | None = opt(None, "Classifier training epochs (default: the preset's).")
    train_lr: float | None = opt(None, "Classifier training peak learning rate (default: the preset's).")
    crop_seconds: float = opt(2.0, "Classifier training: random crops of this many seconds (0: whole utterances).")
    layer_rule: str | None = opt(
        None,
        "Erasure: which layers to edit: mean (forget energy >= 1/|L|), top, threshold or all (default: the method's).",
    )
    sweep_ranks: tuple[int, ...] | None = opt(
        None, "Erasure with --sweep: comma list of forget ranks tried, smallest first (default: 1,2,4)."
    )
    scope: str | None = opt(
        None,
        "Erasure: weights to edit: all, head (class weights only; embeddings untouched), "
        "embedding, or sweep (the rule chooses among head, embedding and all on the training "
        "partitions; the default with --sweep, else all).",
    )


@dataclass(frozen=True)
class SpeechLLMSettings(ClassifierSettings):
    """Settings of the speech LLM (--model speech-llm): its model, where erasure edits, the task it keeps."""

    llm: str = opt(
        "mini",
        "With --model speech-llm: preset tiny or mini (built from config, trained and cached), or "
        "a speech-LLM directory.",
    )
    where: str = opt("both", "With --model speech-llm: erase in the audio tower, the language model (text) or both.")
    keep_task: str = opt(
        "gender",
        "With --model speech-llm: the task that must survive on the same audio: gender "
        "or transcript (TOFU's 'target' is a model; this is a task, hence the name).",
    )
    reference: str | None = opt(
        None, "With --model speech-llm and a directory: the model it was fine-tuned from (task-vector reference)."
    )
    retrained: str | None = opt(
        None,
        "With --model speech-llm and a directory: the same model retrained without "
        "the forgotten data (its row is the gold-standard reference).",
    )


@dataclass(frozen=True)
class VoxCelebConfig(SpeechLLMSettings):
    """Settings of ``voxceleb2 speaker`` and ``voxceleb2 sample`` (the level is the command): the three layers above,
    checked together."""

    def __post_init__(self) -> None:
        _bounded(self, "speakers", 2)
        _bounded(self, "utterances", 2)
        _bounded(self, "videos", 2)
        for key in (
            "forget_speakers",
            "threads",
            "rank",
            "retain_rank",
            "extract_steps",
            "epochs",
            "audit_relearn_steps",
        ):
            _bounded(self, key, 1)
        _bounded(self, "max_trials", 0)
        _bounded(self, "crop_seconds", 0.0)
        _bounded(self, "retain_bound", 0.0)
        _bounded(self, "forget_fraction", 0.0, 0.5)
        _bounded(self, "forget_acc", 0.0, 0.99)
        _choice(self, "model", settings.models())
        _choice(self, "where", WHERE)
        _choice(self, "keep_task", TARGETS)
        _choice(self, "scope", settings.SCOPES)
        if self.sweep_ranks is not None and (not self.sweep_ranks or any(r < 1 for r in self.sweep_ranks)):
            raise ConfigError(f"sweep_ranks must be positive integers, got {self.sweep_ranks!r}", "sweep_ranks")
        known = self.applicable()
        unknown = [m for m in self.methods if m != "all" and m not in known]
        if unknown or not self.methods or ("all" in self.methods and len(self.methods) > 1):
            raise ConfigError(
                f"unknown or inapplicable methods {unknown or list(self.methods)} for --model "
                f"{self.model}; choose from {known} or 'all'",
                "methods",
            )
        wrong = [m for m in self.method_options if m not in known]
        if wrong:
            raise ConfigError(
                f"method_options: {wrong} not applicable to --model {self.model}; choose from {known}", "method_options"
            )
        _choice(self, "layer_rule", settings.LAYER_RULES)
        if not self.kind.is_classifier:  # the speech LLM: its own steps (recipes.voxceleb2.speech_llm)
            if self.audit:
                raise ConfigError(
                    "--audit runs on the classifier here; audit a speech-LLM method's output folder "
                    "with `mmunlearn audit --model DIR ...`",
                    "audit",
                )
            for key, why in CLASSIFIER_ONLY.items():
                _unused(self, key, why)
            _choice(self, "extract", EXTRACT_KINDS)
            if self.extract == "lora" and self.where in ("audio", "both"):
                raise ConfigError(
                    f"extract 'lora' cannot wrap the audio tower's convolutions (where={self.where}): "
                    "use where=text, or extract finetune, gradient or layerwise",
                    "extract",
                )
            return
        for key in SPEECH_LLM_ONLY:
            _unused(self, key, "a setting of --model speech-llm")
        _choice(self, "extract", settings.EXTRACT_KINDS, " does not work on the speaker classifier")
        try:
            for name in self.chosen():
                settings.scopes_for(name, self.resolved_scope(), self.sweep)
        except ValueError as e:
            raise ConfigError(str(e), "scope") from None
        if self.audit:
            self.audit_options()

    @property
    def kind(self) -> Kind:
        """The registered model kind ``--model`` names (:func:`~recipes.voxceleb2.settings.model_kind`): the methods
        that apply to it, and its capabilities choose the path (a classifier's: ECAPA's steps and scopes, its models
        built by the kind's trainer; otherwise the speech LLM's)."""
        return settings.model_kind(self.model)

    def applicable(self) -> list[str]:
        """The methods that apply to ``--model``, in registry order."""
        return names(self.kind.name)

    def chosen(self) -> list[str]:
        """The methods to run: ``methods``, or for 'all' every method that applies (the speech LLM's default list)."""
        if self.methods != ("all",):
            return list(self.methods)
        if not self.kind.is_classifier:
            return list(settings.SPEECH_LLM_METHODS)
        return list(settings.CLASSIFIER_METHODS)

    def resolved_scope(self) -> str:
        """``scope``, or its default for every classifier: sweep with ``--sweep`` (the head tried first,
        :data:`recipes.voxceleb2.settings.SWEEP_SCOPES`), else all."""
        return self.scope or ("sweep" if self.sweep else "all")

    def resolved_retain_bound(self) -> float:
        """``retain_bound``, or its default for the model: a classifier's sweep rule
        (:data:`recipes.voxceleb2.settings.DEFAULT_RETAIN_BOUND`) or a speech LLM's NLL rule
        (:data:`mmunlearn.api.rules.NLL_RETAIN_BOUND`)."""
        if self.retain_bound is not None:
            return self.retain_bound
        return settings.DEFAULT_RETAIN_BOUND if self.kind.is_classifier else NLL_RETAIN_BOUND

    def knobs(self) -> dict[str, Any]:
        """The knobs above under the names methods' configs use (:func:`recipes.voxceleb2.settings.knobs`; unset
        ones None), checked against the task-vector kinds the model takes."""
        return settings.knobs(
            rank=self.rank,
            retain_rank=self.retain_rank,
            scale=self.scale,
            extract_kind=self.extract,
            extract_steps=self.extract_steps,
            extract_lr=self.extract_lr,
            lr=self.lr,
            epochs=self.epochs,
            layer_rule=self.layer_rule,
            sweep_ranks=self.sweep_ranks,
            seed=self.seed,
            extract_kinds=settings.EXTRACT_KINDS if self.kind.is_classifier else EXTRACT_KINDS,
        )

    def method_overrides(self, method: str) -> dict[str, Any]:
        """The overrides of ``method``'s config: the knobs above that its config has, then its own ``method_options``
        (before the sweep's defaults and step budget, which fill only what is unset)."""
        return {**applicable_overrides(get(method).config, self.knobs()), **self.method_options.get(method, {})}

    def audit_options(self) -> Any:
        """``audit_*`` as :class:`mmunlearn.audit.AuditOptions` for the classifier of ``--model``."""
        try:
            return settings.audit_options(
                self.kind.name,
                relearn_steps=self.audit_relearn_steps,
                relearn_lr=self.audit_relearn_lr,
                relearn_on=self.audit_relearn_on,
                attacks=parse_list(self.audit_attacks, ATTACKS, "--audit-attacks"),
            )
        except ValueError as e:
            raise ConfigError(str(e), "audit_relearn_on" if "relearn_on" in str(e) else "audit_attacks") from None


def _bounded(cfg: VoxCelebConfig, key: str, low: float, high: float | None = None) -> None:
    value = getattr(cfg, key)
    if value is None:
        return
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value}", key)
    if value < low or (high is not None and value > high):
        where = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{key} must be {where}, got {value}", key)


def _unused(cfg: VoxCelebConfig, key: str, why: str) -> None:
    """Refuse ``key`` set to other than its default: ``--model`` has no use for it (``why``)."""
    default = next(f.default for f in fields(cfg) if f.name == key)
    if getattr(cfg, key) != default:
        raise ConfigError(f"{key} does not apply to --model {cfg.model} ({why}); leave it unset", key)


def _choice(cfg: VoxCelebConfig, key: str, choices: tuple[str, ...], why: str = "") -> None:
    value = getattr(cfg, key)
    if value is not None and value not in choices:
        raise ConfigError(f"{key} {value!r}{why}: choose one of {', '.join(choices)}", key)
