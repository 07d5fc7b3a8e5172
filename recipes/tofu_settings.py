"""How the TOFU and cTOFU recipes configure the methods: the preset size of a model preset and the sweep rule.

Each method's defaults per preset live in its own config (:mod:`mmunlearn.methods`); real checkpoints use
the TOFU reference settings (lr 1e-5, 5 epochs, effective batch 32), the tiny presets, trained with lr 2e-3
to memorise their data, proportionally larger steps. The sweep rule (``--sweep``): raise the forget NLL to
the base model's level (the model before it ever saw the forget authors) while the retain NLL rises by at
most ``retain_bound`` nats, on the training partitions only.

Memorisation check: unlearning is only measured meaningfully on a target that memorised the forget answers.
After the target is built (and evaluated against the retain model), :func:`memorisation` calls it memorised
when its forget quality against the retain model is at most :data:`MAX_FORGET_QUALITY` and its forget
ROUGE-L at least :data:`MIN_FORGET_ROUGE` of its preset size; ``tofu finetune`` checks the answer NLL of the
forget rows instead (:data:`MAX_FORGET_NLL`, the evaluation being too costly there). The ``micro`` preset is
a test-sized model that never reproduces answers verbatim (its default target on ``synthetic:n_authors=10``:
forget quality 0.012, forget ROUGE-L 0.24 at 24 new tokens, forget answer NLL 1.46 nats; its base: 5.65),
so its ROUGE-L is not checked and its NLL bound is looser; ``mini`` (forget ROUGE-L 1.0) and real
checkpoints (TOFU's targets: forget ROUGE-L ~0.95-1) get the full check.
"""

from __future__ import annotations

import math
from typing import Any

from mmunlearn.config import applicable_overrides
from mmunlearn.methods import SweepRule, get


def preset_size(preset: str) -> str:
    """The method-config preset of a model preset: ``micro``, ``mini``, or ``model_dir`` (a directory)."""
    return preset if preset in ("micro", "mini") else "model_dir"


def method_options(method: str, **options: Any) -> dict[str, Any]:
    """The CLI's method options (``rank``, ``scale``, ``extract_kind``, ``head_rank``, ``lr``, ...) that
    ``method``'s config has; the others are for other methods."""
    return applicable_overrides(get(method).config, options)


def sweep_rule(forget_target: float | None, retain_bound: float) -> SweepRule | None:
    """The training-partition rule (None when there is no target: no sweep)."""
    return None if forget_target is None else SweepRule(forget_target=forget_target, retain_bound=retain_bound)


#: The target's forget quality (KS p-value against the retain model) above which it did not memorise.
MAX_FORGET_QUALITY = 0.05
#: The forget ROUGE-L below which a target did not memorise, per preset size (None: not checked).
MIN_FORGET_ROUGE: dict[str, float | None] = {"micro": None, "mini": 0.9, "model_dir": 0.9}
#: The forget rows' answer NLL (nats, after fine-tuning) above which a model did not memorise them.
MAX_FORGET_NLL: dict[str, float] = {"micro": 2.5, "mini": 0.5, "model_dir": 0.5}


def memorisation(preset: str, forget_quality: float | None, forget_rouge: float | None) -> dict[str, Any]:
    """Whether a target memorised the forget answers: ``{"memorised": bool or None (not measured),
    "forget_quality", "forget_rouge", "max_forget_quality", "min_forget_rouge"}``."""
    min_rouge = MIN_FORGET_ROUGE[preset_size(preset)]
    checks = []
    if forget_quality is not None and math.isfinite(forget_quality):
        checks.append(forget_quality <= MAX_FORGET_QUALITY)
    if min_rouge is not None and forget_rouge is not None:
        checks.append(forget_rouge >= min_rouge)
    return {"memorised": all(checks) if checks else None, "forget_quality": forget_quality,
            "forget_rouge": forget_rouge, "max_forget_quality": MAX_FORGET_QUALITY, "min_forget_rouge": min_rouge}


def memorisation_warning(check: dict[str, Any], hint: str = "--epochs/--lr") -> str | None:
    """The warning for a target that did not memorise (None when it did or it was not measured)."""
    if check.get("memorised") is not False:
        return None
    return (f"the target did not memorise the forget answers: forget quality {_fmt(check['forget_quality'])} vs "
            f"the retain model (memorised: <= {check['max_forget_quality']}), forget ROUGE-L "
            f"{_fmt(check['forget_rouge'])}"
            + (f" (memorised: >= {check['min_forget_rouge']})" if check["min_forget_rouge"] is not None else "")
            + f"; unlearning results will not mean much; train longer: {hint}")


def forget_nll_warning(preset: str, forget_nll: float | None, hint: str = "--epochs/--lr") -> str | None:
    """The warning for a fine-tuned model whose forget rows' answer NLL is above :data:`MAX_FORGET_NLL`."""
    bound = MAX_FORGET_NLL[preset_size(preset)]
    if forget_nll is None or forget_nll <= bound:
        return None
    return (f"the model did not memorise the forget answers: their answer NLL is {forget_nll:.3f} nats "
            f"(memorised: <= {bound}); unlearning results will not mean much; train longer: {hint}")


#: ``--audit`` relearning learning rate per preset size: the tiny presets were fine-tuned at 2e-3, real
#: checkpoints at TOFU's 1e-5 (the attack relearns at about the rate the model was trained with).
AUDIT_RELEARN_LR: dict[str, float] = {"micro": 1e-3, "mini": 1e-3, "model_dir": 1e-5}


def audit_options(preset: str, **overrides: Any):
    """The audit settings of ``--audit`` for a model preset (``overrides``: the CLI's, None = default)."""
    from mmunlearn.audit import AuditOptions

    return AuditOptions(relearn_lr=AUDIT_RELEARN_LR[preset_size(preset)]).replace(**overrides)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
