"""What every optimisation baseline shares: its config, the loss signature and the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class BaselineConfig:
    """Hyperparameters of an optimisation baseline (defaults follow the TOFU reference settings
    for real checkpoints; the recipes scale lr and epochs for the tiny presets)."""

    epochs: int = 5  # passes over the forget set
    lr: float = 1e-5
    batch_size: int = 32
    grad_accum: int = 1
    weight_decay: float = 0.01
    alpha: float = 1.0  # weight of the retain term (GradDiff, KL, NPO, SimNPO)
    gamma: float = 1.0  # weight of the forget term (GradDiff, KL, NPO, SimNPO)
    beta: float = 0.1  # inverse temperature of NPO / SimNPO
    delta: float = 0.0  # SimNPO margin on the length-normalised forget NLL
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossContext:
    """Passed to each loss: the adapter (for scoring), the frozen reference model, the config."""

    adapter: Any
    reference: nn.Module | None
    config: BaselineConfig


# loss(ctx, model, forget_batch, retain_batch) -> scalar
LossFn = Callable[[LossContext, nn.Module, dict, dict], torch.Tensor]


@dataclass(frozen=True)
class Baseline:
    name: str
    loss: LossFn
    needs_reference: bool
    needs_retain: bool
    help: str


REGISTRY: dict[str, Baseline] = {}


def register(name: str, *, needs_reference: bool = False, needs_retain: bool = True, help: str = ""):
    """Register a loss function as a named baseline."""

    def deco(fn: LossFn) -> LossFn:
        REGISTRY[name] = Baseline(name, fn, needs_reference, needs_retain, help or (fn.__doc__ or "").strip())
        return fn

    return deco
