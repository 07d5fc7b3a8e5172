"""The optimisation methods as plug-ins: GradAscent, GradDiff, KL, NPO, SimNPO (one loss each in
:mod:`mmunlearn.baselines`), trained through the shared loop; with a sweep rule they stop early.

A speaker classifier trains with the model in eval mode (BatchNorm running statistics frozen).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from mmunlearn.baselines import REGISTRY as LOSSES
from mmunlearn.baselines import BaselineConfig, unlearn
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.rule import early_stop


def run_loss(name: str):
    """The ``run`` of the optimisation method ``name``."""

    def run(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: BaselineConfig,
            ctx: RunContext) -> MethodResult:
        start = time.perf_counter()
        on_step, trajectory = None, []
        if ctx.rule is not None:
            per_epoch = max(1, math.ceil(len(forget) / (cfg.batch_size * cfg.grad_accum)))
            on_step, trajectory, _ = early_stop(adapter, forget, retain, ctx.rule, per_epoch)
        res = unlearn(adapter, name, forget, retain, cfg, progress=ctx.progress, on_step=on_step,
                      train_mode=ctx.kind != "speaker")
        info = {"final_loss": res.final_loss, "steps": res.steps}
        if on_step is not None:
            restored = on_step.restore_in_bound()
            if restored is not None:
                info["restored_step"] = restored  # the run crossed the retain bound: the in-bound state is kept
        if trajectory:
            info["sweep"] = trajectory
        return MethodResult(adapter, 0.0, time.perf_counter() - start, info)

    return run


for _name in sorted(LOSSES):
    register(_name, BaselineConfig, run_loss(_name), help=LOSSES[_name].help)
