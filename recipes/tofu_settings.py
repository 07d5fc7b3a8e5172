"""How the TOFU and cTOFU recipes configure the methods: the preset size of a model preset and the sweep rule.

Each method's defaults per preset live in its own config (:mod:`mmunlearn.methods`); real checkpoints use
the TOFU reference settings (lr 1e-5, 5 epochs, effective batch 32), the tiny presets, trained with lr 2e-3
to memorise their data, proportionally larger steps. The sweep rule (``--sweep``): raise the forget NLL to
the base model's level (the model before it ever saw the forget authors) while the retain NLL rises by at
most ``retain_bound`` nats, on the training partitions only.
"""

from __future__ import annotations

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
