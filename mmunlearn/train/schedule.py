"""Optimizers and learning-rate schedules of the training loop (torch and transformers implementations)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mmunlearn.train.config import TrainConfig


def make_optimizer(params: Sequence[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (decay on tensors of 2+ dimensions only) or plain SGD (no momentum) over ``params``.

    AdamW is torch's fused implementation where every parameter is a floating-point tensor on the CPU or a CUDA
    device (the same update; on one CPU core a SmolLM2-135M step takes about a seventh of the default's time,
    ``mmunlearn bench precision``), the default implementation otherwise."""
    if not params:
        raise ValueError("no parameters to train")
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [
        g
        for g in ({"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0})
        if g["params"]
    ]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """The schedule over ``total_steps`` optimizer steps.

    - ``onecycle``: ``torch.optim.lr_scheduler.OneCycleLR`` (Smith & Topin 2019) with its peak at
      ``warmup_fraction`` of the run (momentum / Adam beta1 cycled too when the optimizer has one);
    - ``constant``, ``linear``, ``cosine``: transformers' schedules with linear warmup over
      ``warmup_fraction`` of the steps (then constant, linear decay to 0, cosine decay to 0).
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warm = cfg.warmup_fraction
    if cfg.schedule == "onecycle":
        # OneCycleLR's phases need at least 2 steps: a 1-step run is scheduled as 2 (it takes the first rate).
        total = max(total_steps, 2)
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=cfg.lr, total_steps=total, pct_start=warm, cycle_momentum=cfg.optimizer == "adamw"
        )
    from transformers import get_scheduler

    name = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[cfg.schedule]
    return get_scheduler(
        name, optimizer, num_warmup_steps=int(round(warm * total_steps)), num_training_steps=total_steps
    )
