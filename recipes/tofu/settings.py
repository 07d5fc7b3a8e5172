"""How the TOFU and cTOFU recipes configure the methods: the preset size of a model preset and the sweep rule.

Each method's defaults per preset live in its own config (:mod:`mmunlearn.methods`); real checkpoints use
the TOFU reference settings (lr 1e-5, 5 epochs, effective batch 32), the tiny presets, trained with lr 2e-3
to memorise their data, proportionally larger steps. The sweep rule (``--sweep``): raise the forget NLL to
the base model's level (the model before it ever saw the forget authors) while the retain NLL rises by at
most ``retain_bound`` nats, on the training partitions only.

Memorisation check (one rule, :func:`memorisation`, used by ``finetune``, ``eval``, ``run`` and ``compare``):
unlearning is only measured meaningfully on a target that memorised the forget answers. A model memorised
them when their mean answer probability is at least :data:`MIN_FORGET_PROB`, clearly above the pretrained
model's and the retain model's (by :data:`MIN_PROB_GAIN`, each when known), and its greedy forget answers
reach ROUGE-L recall :data:`MIN_FORGET_ROUGE` (per preset size). ``finetune`` measures probability and
ROUGE-L on the forget rows before and after training (the pretrained model's probability comes free);
the recipes compare the target with the retain model too. The ``micro`` preset is a test-sized model that
never reproduces answers verbatim (its default target on ``synthetic:n_authors=10``: forget answer NLL 1.46
nats, ROUGE-L 0.24; its base: 5.65 nats), so its ROUGE-L is not checked and its probability bound is low.
SmolLM2-135M at its preset (lr 3e-4, 6 epochs): forget ROUGE-L 0.97, probability 0.98 (pretrained 0.31 /
0.08). Forget quality is recorded beside the check but is not part of it (it measures the retain model's
distance, which a tiny retain model can make small without any memorisation).
"""

from __future__ import annotations

import math
from typing import Any

from mmunlearn.adapters.base import resolve_device
from mmunlearn.adapters.text.adapter import KIND as TEXT
from mmunlearn.audit import AuditOptions
from mmunlearn.config import applicable_overrides
from mmunlearn.eval.tofu import METRIC_GROUPS
from mmunlearn.methods import SweepRule, get
from mmunlearn.presets.models import REAL_MODEL_PRECISION
from mmunlearn.report import fmt as _fmt
from mmunlearn.train.config import native_bf16


def preset_size(preset: str) -> str:
    """The method-config preset of a model preset: ``micro``, ``mini``, or ``model_dir`` (a directory; the text
    kind's rule, :meth:`mmunlearn.kinds.Kind.size_for`)."""
    return TEXT.size_for(preset)


def default_precision(preset: str, device: str = "auto") -> str:
    """Scoring / generation precision of a model preset on ``device`` (``cpu``, ``cuda`` or ``auto``): bf16 for the
    real checkpoints that measured faster and accurate with it (:data:`mmunlearn.presets.models.REAL_MODEL_PRECISION`)
    where bf16 is native (:func:`mmunlearn.train.config.native_bf16`), else ``no`` (float32)."""
    wanted = REAL_MODEL_PRECISION.get(preset, "no")
    if wanted != "bf16":
        return wanted
    return "bf16" if native_bf16(resolve_device(device).type) else "no"


def knobs_for(method: str, **options: Any) -> dict[str, Any]:
    """The CLI's method options (``rank``, ``scale``, ``extract_kind``, ``head_rank``, ``lr``, ...) that
    ``method``'s config has; the others are for other methods."""
    return applicable_overrides(get(method).config, options)


def sweep_rule(forget_target: float | None, retain_bound: float) -> SweepRule | None:
    """The training-partition rule (None when there is no target: no sweep)."""
    return None if forget_target is None else SweepRule(forget_target=forget_target, retain_bound=retain_bound)


#: The forget answers' mean probability (mean over rows of exp(-answer NLL)) a memorising model reaches.
MIN_FORGET_PROB: dict[str, float] = {"micro": 0.15, "mini": 0.8, "model_dir": 0.8}
#: How far that probability must exceed the pretrained model's and the retain model's (each when known).
MIN_PROB_GAIN: dict[str, float] = {"micro": 0.05, "mini": 0.3, "model_dir": 0.3}
#: The forget ROUGE-L recall of greedy answers a memorising model reaches (None: not checked).
MIN_FORGET_ROUGE: dict[str, float | None] = {"micro": None, "mini": 0.9, "model_dir": 0.85}


def memorisation(
    preset: str,
    forget_prob: float | None,
    forget_rouge: float | None,
    *,
    pretrained_prob: float | None = None,
    retain_prob: float | None = None,
    forget_quality: float | None = None,
) -> dict[str, Any]:
    """Whether a model memorised the forget answers (the module docstring's rule): ``{"memorised": bool or
    None (nothing measured), "failed": [what fell short], the measures and the thresholds}``."""
    size = preset_size(preset)
    min_prob, gain, min_rouge = MIN_FORGET_PROB[size], MIN_PROB_GAIN[size], MIN_FORGET_ROUGE[size]
    failed = []
    measured = _finite(forget_prob) or (min_rouge is not None and _finite(forget_rouge))
    if _finite(forget_prob):
        if forget_prob < min_prob:
            failed.append(f"forget answer probability {_fmt(forget_prob)} (memorised: >= {min_prob})")
        for name, ref in (("pretrained", pretrained_prob), ("retain", retain_prob)):
            if _finite(ref) and forget_prob - ref < gain:
                failed.append(
                    f"forget answer probability {_fmt(forget_prob)} vs the {name} model's {_fmt(ref)} "
                    f"(memorised: at least {gain} above)"
                )
    if min_rouge is not None and _finite(forget_rouge) and forget_rouge < min_rouge:
        failed.append(f"forget ROUGE-L {_fmt(forget_rouge)} (memorised: >= {min_rouge})")
    return {
        "memorised": (not failed) if measured else None,
        "failed": failed,
        "forget_prob": forget_prob,
        "forget_rouge": forget_rouge,
        "pretrained_prob": pretrained_prob,
        "retain_prob": retain_prob,
        "forget_quality": forget_quality,
        "min_forget_prob": min_prob,
        "min_prob_gain": gain,
        "min_forget_rouge": min_rouge,
    }


def memorisation_warning(check: dict[str, Any], hint: str = "--epochs/--lr", what: str = "the target") -> str | None:
    """The warning for a model that did not memorise (None when it did or nothing was measured)."""
    if check.get("memorised") is not False:
        return None
    return (
        f"{what} did not memorise the forget answers: "
        + "; ".join(check["failed"])
        + f"; unlearning results will not mean much; train longer: {hint}"
    )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: ``--audit`` relearning learning rate per preset size: the tiny presets were fine-tuned at 2e-3, real
#: checkpoints at TOFU's 1e-5 (the attack relearns at about the rate the model was trained with).
AUDIT_RELEARN_LR: dict[str, float] = {"micro": 1e-3, "mini": 1e-3, "model_dir": 1e-5}


def audit_options(preset: str, **overrides: Any):
    """The audit settings of ``--audit`` for a model preset (``overrides``: the CLI's, None = default)."""
    return AuditOptions(relearn_lr=AUDIT_RELEARN_LR[preset_size(preset)]).replace(**overrides)


def parse_metrics(text: str | None) -> tuple[str, ...] | None:
    """``--metrics forget,utility`` as evaluate_tofu's metric groups (None or ``all``: every group)."""
    if text is None or text.strip() == "all":
        return None
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METRIC_GROUPS]
    if unknown or not chosen:
        raise ValueError(
            f"unknown metric group(s) {unknown or '(none given)'}; choose from {', '.join(METRIC_GROUPS)} or all"
        )
    return None if set(chosen) == set(METRIC_GROUPS) else tuple(g for g in METRIC_GROUPS if g in chosen)
