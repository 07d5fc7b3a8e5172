"""The settings every robustness audit reads (:class:`AuditOptions`), declared once with their help text."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from mmunlearn.kinds import get_kind

#: The attacks an audit can run, in the order they are reported.
ATTACKS: tuple[str, ...] = ("paraphrase", "quantise", "relearn", "probe")
#: Where relearning takes its training data: part of the forget set, or (stricter) retain data only.
RELEARN_SOURCES: tuple[str, ...] = ("forget", "retain")
#: Weight formats of the quantisation round trip (bits -> GGUF type, see :mod:`mmunlearn.audit.quantise`).
BITS: tuple[int, ...] = (8, 4)


def _opt(default: Any, help: str) -> Any:
    if isinstance(default, (tuple, list)):
        return field(default_factory=lambda: tuple(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class AuditOptions:
    """Budgets and sizes of the attacks. The relearning defaults follow the few-step attacks of
    Hu et al. 2024 and Lynch et al. 2024 (tens of steps on a small related set); ``relearn_lr`` suits the
    tiny presets (trained at 2e-3) and should be the model's fine-tuning rate for real checkpoints (1e-5)."""

    attacks: tuple[str, ...] = _opt(ATTACKS, "Attacks to run: paraphrase, quantise, relearn, probe.")
    relearn_steps: int = _opt(20, "Relearning: optimizer steps (the same budget for every model).")
    relearn_lr: float = _opt(1e-3, "Relearning: learning rate (AdamW, constant).")
    relearn_batch_size: int = _opt(8, "Relearning: batch size.")
    relearn_fraction: float = _opt(
        0.25,
        "Relearning: share of each forget author's (speaker's) items trained on; "
        "the rest is where recovery is measured.",
    )
    relearn_on: str = _opt(
        "forget",
        "Relearning data: 'forget' (the share above) or 'retain' (retain data only, "
        "the stricter variant: no forget item is ever seen).",
    )
    bits: tuple[int, ...] = _opt(BITS, "Quantisation: weight bit widths to round-trip (8 and/or 4).")
    probe_folds: int = _opt(5, "Probing: cross-validation folds of the linear probe.")
    max_new_tokens: int = _opt(64, "Text: greedy generation length for forget ROUGE-L.")
    batch_size: int = _opt(16, "Scoring batch size.")
    seed: int = _opt(0, "Seed of the relearning order and the probe folds.")

    def __post_init__(self) -> None:
        unknown = [a for a in self.attacks if a not in ATTACKS]
        if unknown or not self.attacks:
            raise ValueError(f"unknown attack(s) {unknown or '(none given)'}; choose from {', '.join(ATTACKS)}")
        if self.relearn_on not in RELEARN_SOURCES:
            raise ValueError(f"relearn_on must be one of {RELEARN_SOURCES}, got {self.relearn_on!r}")
        bad_bits = [b for b in self.bits if b not in BITS]
        if bad_bits or not self.bits:
            raise ValueError(f"bits must be among {BITS}, got {list(self.bits)}")
        for name in ("relearn_steps", "relearn_batch_size", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.probe_folds < 2:
            raise ValueError(f"probe_folds must be >= 2, got {self.probe_folds}")
        if not 0 < self.relearn_fraction < 1:
            raise ValueError(f"relearn_fraction must be in (0, 1), got {self.relearn_fraction}")
        if not self.relearn_lr > 0:
            raise ValueError(f"relearn_lr must be positive, got {self.relearn_lr}")

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of one option (for CLI options)."""
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)

    def replace(self, **changes: Any) -> AuditOptions:
        """A copy with ``changes`` (None values ignored, so unset CLI options keep the defaults)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


#: Defaults that differ from :class:`AuditOptions`' own (the text ones), keyed by a capability of the model kind
#: (:class:`mmunlearn.kinds.Kind`): every registered kind that has the capability takes them, so a classifier kind
#: added later (the Hugging Face audio classifiers) gets the classifier defaults with no entry of its own. Speaker
#: classifiers: 20 steps at 1e-3 brought every FSDD classifier, the retrained one too, to 100 % on the forget
#: speaker, so the attack told no model from another; 5 steps at 1e-4 leave the retrained model its own rate.
#: ``mmunlearn audit`` and the recipes' ``--audit`` both read this table (:func:`options_for`).
CAPABILITY_DEFAULTS: dict[str, dict[str, Any]] = {"is_classifier": dict(relearn_steps=5, relearn_lr=1e-4)}


def kind_defaults(kind: str) -> dict[str, Any]:
    """The entries of :data:`CAPABILITY_DEFAULTS` whose capability the registered model ``kind`` has (asked of the
    kind registry); none for a kind no module registered."""
    try:
        registered = get_kind(kind)
    except ValueError:
        return {}
    chosen: dict[str, Any] = {}
    for capability, values in CAPABILITY_DEFAULTS.items():
        if getattr(registered, capability, False) is True:
            chosen.update(values)
    return chosen


def options_for(kind: str, **overrides: Any) -> AuditOptions:
    """The audit settings of a model ``kind`` (``text``, ``speaker``, ``hf-audio``, ``speech-llm``, ...): the
    defaults, those of the kind's capabilities (:func:`kind_defaults`), then ``overrides`` (None values ignored, as
    unset CLI options)."""
    return AuditOptions(**kind_defaults(kind)).replace(**overrides)


def parse_list(text: str | None, choices: tuple, what: str, cast=str) -> tuple | None:
    """``"a,b"`` (or ``all``) as a tuple of ``choices``; None stays None; a ValueError names ``what``."""
    if text is None:
        return None
    if text.strip() == "all":
        return tuple(choices)
    try:
        chosen = tuple(cast(t.strip()) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"{what}: cannot read {text!r}; choose from {', '.join(map(str, choices))} or all") from None
    bad = [c for c in chosen if c not in choices]
    if bad or not chosen:
        raise ValueError(f"{what}: unknown {bad or '(none given)'}; choose from {', '.join(map(str, choices))} or all")
    return chosen
