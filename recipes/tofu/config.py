"""The TOFU recipes' settings as config dataclasses: :class:`RecipeConfig` (what ``tofu`` and ``ctofu`` share beside
every benchmark's settings, :class:`recipes.recipe_config.BenchmarkSettings`: the method, data, models, T3's knobs,
fine-tuning, evaluation batches, the comparison's budget) and :class:`TofuConfig` (TOFU's data, evaluation and
model options). ``tofu run|compare`` take one whole (:mod:`recipes.recipe_cli`: options, ``--config FILE.yaml``,
``key=value``); every check raises a ``ValueError`` naming the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmunlearn.adapters.text.adapter import KIND as TEXT
from mmunlearn.adapters.text.adapter import PRECISIONS
from mmunlearn.audit import ATTACKS
from mmunlearn.audit.options import parse_list
from mmunlearn.config import opt
from mmunlearn.eval.tofu import check_max_new_tokens
from mmunlearn.methods import names
from mmunlearn.taskvec.extract import KINDS
from mmunlearn.train import TrainConfig
from recipes.recipe_config import BenchmarkSettings, ConfigError
from recipes.tofu.settings import audit_options, knobs_for, parse_metrics

#: The settings ``run`` does not take (it runs one ``method``) and those ``compare`` does not take.
RUN_EXCLUDES = (
    "methods",
    "audit",
    "audit_relearn_steps",
    "audit_relearn_lr",
    "audit_relearn_on",
    "audit_attacks",
    "jobs",
    "budget_minutes",
    "keep_going",
    "rehearse",
)
COMPARE_EXCLUDES = ("method",)
#: The knobs a recipe passes to every method whose config has them (the field name in the method's config).
SHARED_KNOBS = {
    "rank": "rank",
    "scale": "scale",
    "extract": "extract_kind",
    "extract_steps": "extract_steps",
    "temperature": "temperature",
    "t3_rank": "head_rank",
    "lr": "lr",
    "epochs": "epochs",
}
FT_PRECISIONS = ("no", "bf16", "auto")


def _positive(cfg: Any, *keys: str) -> None:
    for key in keys:
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value}", key)


@dataclass(frozen=True)
class RecipeConfig(BenchmarkSettings):
    """Settings the TOFU and cTOFU recipes share (beside every benchmark's, :class:`BenchmarkSettings`)."""

    method: str | None = opt(None, "A method of `mmunlearn methods` (qr-erase, svd-unlearn, grad_diff, t3, rmu, ...).")
    data: str = opt("synthetic", "TOFU folder of JSON splits, a hub id, or 'synthetic[:n_authors=40,...]' (built in).")
    preset: str = opt("micro", "Model preset: micro (tests), mini (CPU demo), or a model directory to fine-tune.")
    authors: int | None = opt(None, "Keep N authors: the first retain authors plus forget authors in proportion.")
    base: str = opt(
        "target",
        "Task-vector reference for erasure methods: target, base (the preset's pretrained base) or a model directory.",
    )
    retain_bound: float = opt(0.1, "Sweep rule: largest allowed rise of the retain NLL (nats).")
    max_new_tokens: int | str = opt(
        200,
        "Greedy generation length for ROUGE: a number (the reference uses 200) or "
        "'auto' (lean: per batch, its longest gold answer in tokens + 16).",
    )
    temperature: float | None = opt(None, "T3 temperature T >= 1.")
    t3_rank: int | None = opt(None, "T3 head rank h.")
    ft_epochs: int | None = opt(
        None, "Fine-tuning of the built target and retain models: epochs (default: the preset's)."
    )
    ft_lr: float | None = opt(None, "Fine-tuning of the built target and retain models: learning rate.")
    ft_batch_size: int | None = opt(None, "Fine-tuning of the built target and retain models: micro-batch size.")
    ft_grad_accum: int | None = opt(
        None, "Fine-tuning of the built target and retain models: gradient accumulation steps."
    )
    ft_max_steps: int | None = opt(
        None,
        "Fine-tuning of the built target and retain models: at most N optimizer steps (the schedule fitted to them).",
    )
    ft_precision: str | None = opt(
        None,
        "Fine-tuning of the built target and retain models: no, bf16 (autocast, "
        "also on CPU) or auto (bf16 on a GPU that has it).",
    )
    ft_checkpoint_every: int | None = opt(
        None,
        "Fine-tuning of the built target and retain models: a resumable "
        "training state every N optimizer steps (default: the preset's; 0: "
        "none, e.g. on a GPU, where saving a 135M model's state every few "
        "steps costs more than a lost run).",
    )
    pretrain_max_steps: int | None = opt(
        None,
        "A built preset's (micro, mini) pretraining of its base: at most N optimizer steps (tests and rehearsals).",
    )
    parallel_builds: bool = opt(
        False,
        "Build the target and retain models at once, each in its own process with one "
        "torch thread (on a 2-core CPU both cores; the base model is built first).",
    )
    score_batch: int = opt(16, "Evaluation: rows per teacher-forced scoring batch (a GPU takes 64 or more).")
    gen_batch: int | None = opt(
        None, "Evaluation: rows per greedy-generation batch (ROUGE-L; default: the scoring batch)."
    )
    jobs: int = opt(
        1,
        "compare: method stages run at once, each in its own process (`run` with these settings, `threads` torch "
        "threads each; logs in OUT/jobs/); 2 uses both cores of a 2-core CPU.",
    )
    budget_minutes: float | None = opt(
        None,
        "compare: wall-clock minutes (from the command's start, the models "
        "included) after which no method starts; a method whose start plus the "
        "longest method so far would pass it is skipped and listed (default: "
        "no budget).",
    )
    keep_going: bool = opt(
        False,
        "compare: a method that fails is listed with its error and the next one runs "
        "(default: the error stops the comparison).",
    )
    rehearse: bool = opt(
        False,
        "compare: rehearse this config on the CPU at the smallest size through the same code "
        "(preset micro, a few training steps, the same data folder and methods; output in "
        "OUT_rehearsal): it fails where the full run would, in minutes.",
    )

    def __post_init__(self) -> None:
        try:
            check_max_new_tokens(self.max_new_tokens)
        except ValueError as e:
            raise ConfigError(str(e), "max_new_tokens") from None
        if self.extract is not None and self.extract not in KINDS:
            raise ConfigError(f"extract: choose from {', '.join(KINDS)}, got {self.extract!r}", "extract")
        _positive(
            self,
            "authors",
            "extract_steps",
            "t3_rank",
            "rank",
            "epochs",
            "threads",
            "pretrain_max_steps",
            "score_batch",
            "gen_batch",
            "jobs",
        )
        if self.ft_checkpoint_every is not None and self.ft_checkpoint_every < 0:
            raise ConfigError(
                f"ft_checkpoint_every must be >= 0, got {self.ft_checkpoint_every}", "ft_checkpoint_every"
            )
        if self.budget_minutes is not None and not self.budget_minutes > 0:
            raise ConfigError(f"budget_minutes must be positive, got {self.budget_minutes}", "budget_minutes")
        self.train_overrides()
        if not self.retain_bound >= 0:
            raise ConfigError(f"retain_bound must be >= 0, got {self.retain_bound}", "retain_bound")
        known = names(TEXT.name)
        unknown = [m for m in self.methods if m != "all" and m not in known]
        if unknown or not self.methods or ("all" in self.methods and len(self.methods) > 1):
            raise ConfigError(f"unknown methods {unknown or list(self.methods)}; choose from {known} or all", "methods")
        if self.method is not None and self.method not in known:
            raise ConfigError(f"unknown method {self.method!r}; choose from {known}", "method")
        if self.audit:
            self.audit_options()

    def chosen(self) -> list[str]:
        """The methods a comparison runs, in registry order for 'all'."""
        return names(TEXT.name) if self.methods == ("all",) else list(self.methods)

    def knobs(self) -> dict[str, Any]:
        """The shared knobs that are set, under the names methods' configs use (``extract`` -> ``extract_kind``)."""
        return {SHARED_KNOBS[k]: getattr(self, k) for k in SHARED_KNOBS if getattr(self, k) is not None}

    def method_overrides(self, method: str) -> dict[str, Any]:
        """The overrides of ``method``'s config: the shared knobs its config has, then its own ``method_options``."""
        return {**knobs_for(method, **self.knobs()), **self.method_options.get(method, {})}

    def train_overrides(self) -> dict[str, Any]:
        """The ``ft_*`` settings as ``build_models`` overrides (:func:`train_overrides`)."""
        return train_overrides(
            epochs=self.ft_epochs,
            lr=self.ft_lr,
            batch_size=self.ft_batch_size,
            grad_accum=self.ft_grad_accum,
            max_steps=self.ft_max_steps,
            precision=self.ft_precision,
        )

    def build_options(self) -> dict[str, Any]:
        """How the target and retain models are built, as :func:`mmunlearn.presets.parallel.build_models_parallel`
        takes them (``overrides``: :meth:`train_overrides`)."""
        every = "auto" if self.ft_checkpoint_every is None else (self.ft_checkpoint_every or None)
        pretrain = {"max_steps": self.pretrain_max_steps} if self.pretrain_max_steps is not None else None
        return {
            "overrides": self.train_overrides(),
            "pretrain_overrides": pretrain,
            "checkpoint_every": every,
            "parallel": self.parallel_builds,
        }

    def budget_seconds(self) -> float | None:
        """``budget_minutes`` in seconds (None: no budget)."""
        return None if self.budget_minutes is None else self.budget_minutes * 60.0

    def audit_options(self):
        """``audit_*`` as :class:`mmunlearn.audit.AuditOptions` for the preset; generations at most 64 tokens."""
        tokens = self.max_new_tokens if isinstance(self.max_new_tokens, int) else 64
        try:
            return audit_options(
                self.preset,
                relearn_steps=self.audit_relearn_steps,
                relearn_lr=self.audit_relearn_lr,
                relearn_on=self.audit_relearn_on,
                attacks=parse_list(self.audit_attacks, ATTACKS, "--audit-attacks"),
                max_new_tokens=min(64, tokens),
            )
        except ValueError as e:
            raise ConfigError(str(e), "audit_relearn_on" if "relearn_on" in str(e) else "audit_attacks") from None


@dataclass(frozen=True)
class TofuConfig(RecipeConfig):
    """Settings of ``tofu run`` and ``tofu compare``: the shared ones plus TOFU's split, evaluation and models."""

    forget_split: str = opt("forget10", "Forget split: forget01, forget05 or forget10.")
    metrics: str | None = opt(
        None, "Metric groups to compute, comma-separated: forget, memorization, utility, mia (default: all)."
    )
    utility_items: int | None = opt(
        None,
        "Evaluate only the first N real-authors and N world-facts items (lean; "
        "default: all 100 + 117, the reference). Recorded in the logs.",
    )
    precision: str | None = opt(
        None,
        "Scoring and generation precision: no (float32) or bf16 (autocast scoring, "
        "bf16 weights for greedy generation). Default: bf16 for smollm2-135m, no "
        "otherwise.",
    )
    rule_retain_items: int | None = opt(
        None,
        "The sweep rule scores N retain rows spread over the retain partition "
        "(default: all of it); fewer makes every sweep point cheaper.",
    )
    target: Path | None = opt(
        None,
        "Target model folder (e.g. from `tofu finetune --out DIR`) to use instead of "
        "building the preset's target; its train_log.json names its base.",
    )
    retain_model: Path | None = opt(
        None,
        "Retain model folder (never trained on the forget authors) to use instead "
        "of building the preset's retain model.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"precision: choose from {', '.join(PRECISIONS)}, got {self.precision!r}", "precision")
        try:
            parse_metrics(self.metrics)
        except ValueError as e:
            raise ConfigError(str(e), "metrics") from None
        _positive(self, "utility_items", "rule_retain_items")


def train_overrides(prefix: str = "ft_", **values: Any) -> dict[str, Any]:
    """Fine-tuning settings (``epochs``, ``lr``, ``batch_size``, ``grad_accum``, ``max_steps``, ``precision``; None:
    the preset's) as ``build_models`` / ``finetune`` overrides, checked by :class:`mmunlearn.train.TrainConfig`; a
    :class:`ConfigError` names the setting as ``prefix + name``."""
    precision, max_steps = values.pop("precision", None), values.pop("max_steps", None)
    if precision is not None and precision not in FT_PRECISIONS:
        raise ConfigError(f"choose from {', '.join(FT_PRECISIONS)}, got {precision!r}", prefix + "precision")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"must be a positive integer, got {max_steps}", prefix + "max_steps")
    overrides = {k: v for k, v in {**values, "mixed_precision": precision}.items() if v is not None}
    for key, value in overrides.items():
        try:
            TrainConfig(epochs=1).replace(**{key: value})
        except ValueError as e:
            raise ConfigError(str(e), prefix + ("precision" if key == "mixed_precision" else key)) from None
    return {**overrides, **({"max_steps": max_steps} if max_steps is not None else {})}
