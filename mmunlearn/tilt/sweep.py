"""Choose the T3 temperature with the training-partition rule (never the evaluation metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmunlearn.tilt.head import TiltHead


def choose_temperature(adapter, head: TiltHead, forget: Sequence[Any], retain: Sequence[Any], *,
                       temperatures: Sequence[float], forget_target: float, retain_bound: float,
                       retain_items: Sequence[Any] | None = None) -> tuple[float, list[dict]]:
    """Score each temperature on the training partitions; the rule of the erase sweep picks one.

    Returns the chosen T and the (T, forget NLL, retain NLL) points (tilted model's answer NLLs).
    """
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.tilt.model import TiltedCausalLM
    from mmunlearn.methods.erase_method import SweepPoint, choose, mean_nll

    check = retain_items or retain
    base_f, base_r = mean_nll(adapter, forget), mean_nll(adapter, check)
    points = []
    for t in temperatures:
        tilted_model = TiltedCausalLM(adapter.model, head, t)
        tilted = adapter.with_model(tilted_model) if hasattr(adapter, "with_model") else TextLLMAdapter(
            tilted_model, adapter.tokenizer, max_length=adapter.max_length, use_chat_template=adapter.use_chat_template)
        points.append(SweepPoint(None, t, mean_nll(tilted, forget), mean_nll(tilted, check)))
        tilted.model.tap.remove()
    best = choose(points, base_f, base_r, forget_target, retain_bound)
    return best.scale, [{"temperature": p.scale, "forget_nll": p.forget_nll, "retain_nll": p.retain_nll} for p in points]
