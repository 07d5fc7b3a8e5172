"""Every unlearning method by name, behind one call: ``run_method(name, target, forget, retain, ...)``.

Methods: ``qr-erase`` (localised CPQR erasure, column space), ``qr-erase-rows`` (also the retain
row space), ``svd-unlearn`` (full SVD, no localisation: the UNLEARN baseline), the optimisation
baselines (``grad_ascent``, ``grad_diff``, ``kl``, ``npo``, ``simnpo``) and ``t3`` (temper-then-tilt:
the base stays frozen; the returned adapter wraps it with a tilt head).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mmunlearn.baselines import REGISTRY as BASELINES
from mmunlearn.baselines import BaselineConfig, unlearn
from mmunlearn.methods.erase_method import EraseMethodConfig, changed_fraction, run_erase_method

ERASE_METHODS = {
    "qr-erase": {"method": "cpqr", "localize": True, "rows": False},
    "qr-erase-rows": {"method": "cpqr", "localize": True, "rows": True},
    "svd-unlearn": {"method": "svd", "localize": False, "rows": False},
}
METHODS = (*ERASE_METHODS, *sorted(BASELINES), "t3")


@dataclass
class MethodSettings:
    """Per-method settings a recipe passes in (one object for all methods)."""

    erase: EraseMethodConfig = field(default_factory=EraseMethodConfig)
    erase_sweep: dict | None = None  # see run_erase_method
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    baseline_sweep: dict | None = None  # {"forget_target": x, "retain_bound": y}: early stop by the rule
    t3: dict = field(default_factory=lambda: {"rank": 20, "epochs": 100, "lr": 1e-2, "temperature": 1.0})
    t3_sweep: dict | None = None  # {"temperatures": [...], "forget_target": x, "retain_bound": y}
    cache_dir: str | None = None
    progress: bool = True
    train_mode: bool = True  # False: baselines train with the model in eval mode (BatchNorm stats frozen)


@dataclass
class MethodResult:
    """An adapter to evaluate, and what it cost."""

    adapter: Any
    extract_seconds: float  # task vectors or hidden-state cache (0 for the baselines)
    unlearn_seconds: float  # the unlearning itself (erase / training / head fitting)
    changed_fraction: float  # of the base model's parameters (T3: 0, the base is frozen)
    info: dict = field(default_factory=dict)


def run_method(name: str, target, forget: Sequence[Any], retain: Sequence[Any], settings: MethodSettings | None = None,
               *, reference=None) -> MethodResult:
    """Unlearn ``forget`` from the adapter ``target`` (modified in place, except by ``t3``).

    ``reference``: adapter the erasure methods take task vectors from (default: the target).
    """
    s = settings or MethodSettings()
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {list(METHODS)}")
    before = {k: v.detach().clone() for k, v in target.model.state_dict().items()}
    if name in ERASE_METHODS:
        cfg = replace(s.erase, **ERASE_METHODS[name])
        out = run_erase_method(target, forget, retain, cfg, reference=reference, sweep=s.erase_sweep,
                               progress=s.progress)
        info = {"selected_layers": out.report.selected, "chosen": out.chosen,
                "sweep": [vars(p) for p in out.sweep], "energies": out.report.energies}
        return MethodResult(target, out.extract_seconds, out.erase_seconds, changed_fraction(before, target.model),
                            info | {"report": out.report})
    if name in BASELINES:
        start = time.perf_counter()
        on_step, trajectory = _early_stop(target, forget, retain, s) if s.baseline_sweep else (None, [])
        res = unlearn(target, name, forget, retain, s.baseline, progress=s.progress, on_step=on_step,
                      train_mode=s.train_mode)
        return MethodResult(target, 0.0, time.perf_counter() - start, changed_fraction(before, target.model),
                            {"final_loss": res.final_loss, "steps": res.steps, "sweep": trajectory})
    return _run_t3(target, forget, retain, s)


def _early_stop(target, forget, retain, s: MethodSettings):
    """The sweep rule for the baselines: a few times an epoch, score the training partitions and stop
    once the forget NLL reaches the target or the retain NLL rose by more than the bound (the
    rule's optional ``forget_measure`` / ``retain_measure`` replace the NLLs, as in the erase sweep)."""
    import math

    from mmunlearn.methods.erase_method import mean_nll

    rule = s.baseline_sweep
    check = rule.get("retain_items") or retain
    measure_f, measure_r = rule.get("forget_measure", mean_nll), rule.get("retain_measure", mean_nll)
    per_epoch = max(1, math.ceil(len(forget) / (s.baseline.batch_size * s.baseline.grad_accum)))
    every = max(1, per_epoch // rule.get("checks_per_epoch", 4))  # a finer stop than once an epoch
    base_r = measure_r(target, check)
    trajectory: list[dict] = []

    def on_step(step: int, _loss: float) -> bool:
        if step % every:
            return False
        was_training = target.model.training
        target.model.eval()
        f, r = measure_f(target, forget), measure_r(target, check)
        target.model.train(was_training)
        trajectory.append({"step": step, "forget_nll": f, "retain_nll": r})
        return f >= rule["forget_target"] or r - base_r > rule["retain_bound"]

    return on_step, trajectory


def _run_t3(target, forget, retain, s: MethodSettings) -> MethodResult:
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.tilt import TiltedCausalLM
    from mmunlearn.tilt.sweep import choose_temperature
    from mmunlearn.tilt.train import train_tilt

    opts = dict(s.t3)
    temperature = opts.pop("temperature", 1.0)
    fit = train_tilt(target, retain, forget, cache_dir=s.cache_dir, progress=s.progress, **opts)
    info = {"train_accuracy": fit.train_accuracy, "head_parameters": fit.parameters, "head_fraction": fit.fraction,
            "cache_reused": fit.cache_reused}
    if s.t3_sweep:
        temperature, points = choose_temperature(target, fit.head, forget, retain, **s.t3_sweep)
        info["sweep"] = points
    info["temperature"] = temperature
    tilted_model = TiltedCausalLM(target.model, fit.head, temperature)
    if hasattr(target, "with_model"):  # adapters that know how to wrap another model (speech LLM)
        tilted = target.with_model(tilted_model)
    else:
        tilted = TextLLMAdapter(tilted_model, target.tokenizer, max_length=target.max_length,
                                use_chat_template=target.use_chat_template)
    return MethodResult(tilted, fit.cache_seconds, fit.train_seconds, 0.0, info)
