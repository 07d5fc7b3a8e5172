"""T3 (temper-then-tilt) as a plug-in: the base stays frozen; a low-rank head on cached hidden states
estimates P(retain | x, y) and decoding samples from softmax(log p(y|x) / T + log f(x, y)).

With a sweep rule the temperature is chosen on the training partitions (Scorer of the rule). The returned adapter wraps the base with the head
(:class:`mmunlearn.tilt.TiltedCausalLM`); the harness writes the head beside the unchanged base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mmunlearn.config import PresetConfig, opt
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.rule import Scorer, SweepPoint, choose

_SMALL = dict(head_rank=8, head_epochs=60, head_lr=2e-2)


@dataclass(frozen=True)
class T3Config(PresetConfig):
    """Settings of T3's tilt head and decoding."""

    head_rank: int = opt(20, "Rank of the tilt head.")
    head_epochs: int = opt(100, "Full-batch epochs of head training on the cached states.")
    head_lr: float = opt(1e-2, "Learning rate of the head.")
    temperature: float = opt(1.0, "Decoding temperature T >= 1 (without a sweep).")
    sweep_temperatures: tuple[float, ...] = opt((1.0, 1.25, 1.5, 2.0),
                                                "With a sweep rule: the temperatures tried.")

    PRESETS: ClassVar[dict] = {("text", "micro"): _SMALL, ("speech-llm", "tiny"): _SMALL,
                               ("speech-llm", "mini"): _SMALL}


def _tilted(adapter, head, temperature: float):
    from mmunlearn.tilt import TiltedCausalLM

    return adapter.with_model(TiltedCausalLM(adapter.model, head, temperature))


def run(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: T3Config, ctx: RunContext) -> MethodResult:
    """Fit the head on the frozen model's states; wrap the model (temperature swept with ``ctx.rule``)."""
    from mmunlearn.tilt.train import train_tilt

    fit = train_tilt(adapter, retain, forget, rank=cfg.head_rank, epochs=cfg.head_epochs, lr=cfg.head_lr, cache_dir=ctx.cache_dir,
                     progress=ctx.progress)
    info: dict = {"train_accuracy": fit.train_accuracy, "head_parameters": fit.parameters,
                  "head_fraction": fit.fraction, "cache_reused": fit.cache_reused}
    temperature = cfg.temperature
    if ctx.rule is not None:
        scorer = Scorer(ctx.rule, adapter, forget, retain)
        points = []
        for t in cfg.sweep_temperatures:
            tilted = _tilted(adapter, fit.head, t)
            points.append(SweepPoint(None, t, *scorer.score(tilted)))
            tilted.model.tap.remove()
        rule = ctx.rule
        temperature = choose(points, scorer.base_forget, scorer.base_retain, rule.forget_target,
                             rule.retain_bound).scale
        info["sweep"] = [{"temperature": p.scale, "forget_nll": p.forget_nll, "retain_nll": p.retain_nll}
                         for p in points]
    info["temperature"] = temperature
    return MethodResult(_tilted(adapter, fit.head, temperature), fit.cache_seconds, fit.train_seconds, info)


register("t3", T3Config, run, kinds=("text", "speech-llm"), edits_weights=False,
         help="Temper-then-tilt: frozen base, low-rank head estimating P(retain | x, y), tilted decoding.")
