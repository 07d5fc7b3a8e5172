"""The optimisation methods as plug-ins: GradAscent, GradDiff, KL, NPO, SimNPO (one loss each in
:mod:`mmunlearn.baselines`), trained through the shared loop; with a sweep rule they stop early.

A kind marked ``train_in_eval_mode`` (:mod:`mmunlearn.kinds`; e.g. speaker classifiers, their BatchNorm running
statistics frozen) trains with the model in eval mode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from mmunlearn.baselines import REGISTRY as LOSSES
from mmunlearn.baselines import BaselineConfig, unlearn
from mmunlearn.kinds import get_kind
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.rule import early_stop

#: Under a sweep rule the epochs are a cap (the run stops once the rule is met or the retain bound is crossed); the
#: speaker entry points (``voxceleb2 speaker|sample``, ``mmunlearn.unlearn``) raise the presets' cap to reach at
#: least this many optimizer steps unless the user sets the epochs: 5 epochs were 10 steps on a 21-segment forget
#: set, too few to move the forget speakers at lr 1e-4, while a large forget set keeps its epochs.
RULE_MIN_STEPS = 100


def budget_epochs(cfg: BaselineConfig, n_forget: int, min_steps: int = RULE_MIN_STEPS) -> int:
    """The epoch cap that gives a run of ``cfg`` on ``n_forget`` items at least ``min_steps`` optimizer steps (never
    fewer epochs than ``cfg`` has): the budget grows with the forget set, and a small set still gets enough steps."""
    if n_forget < 1 or min_steps < 0:
        raise ValueError(f"budget_epochs needs n_forget >= 1 and min_steps >= 0, got {n_forget}, {min_steps}")
    per_epoch = max(1, math.ceil(n_forget / (cfg.batch_size * cfg.grad_accum)))
    return max(cfg.epochs, math.ceil(min_steps / per_epoch))


def run_loss(name: str):
    """The ``run`` of the optimisation method ``name``."""

    def run(
        adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: BaselineConfig, ctx: RunContext
    ) -> MethodResult:
        start = time.perf_counter()
        on_step, trajectory, scorer = None, [], None
        if ctx.rule is not None:
            per_epoch = max(1, math.ceil(len(forget) / (cfg.batch_size * cfg.grad_accum)))
            on_step, trajectory, scorer = early_stop(
                adapter,
                forget,
                retain,
                ctx.rule,
                per_epoch,
                total_steps=per_epoch * cfg.epochs,
                label=name if ctx.progress else None,
            )
        res = unlearn(
            adapter,
            name,
            forget,
            retain,
            cfg,
            progress=ctx.progress,
            on_step=on_step,
            train_mode=not get_kind(ctx.kind).train_in_eval_mode,
        )
        info = {"final_loss": res.final_loss, "steps": res.steps, "epoch_cap": cfg.epochs}
        if on_step is not None:
            restored = on_step.restore_in_bound()
            if restored is not None:
                info["restored_step"] = restored  # the run crossed the retain bound: the in-bound state is kept
        if trajectory:
            info["sweep"] = trajectory
        if scorer is not None:
            info["rule_seconds"] = scorer.seconds  # of the unlearn time: scoring the rule's measures
        return MethodResult(adapter, 0.0, time.perf_counter() - start, info)

    return run


for _name in sorted(LOSSES):
    register(_name, BaselineConfig, run_loss(_name), help=LOSSES[_name].help)
