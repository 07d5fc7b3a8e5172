"""What every optimisation baseline shares: its config, the loss signature and the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from mmunlearn.config import PresetConfig, opt

# Real checkpoints: TOFU's reference is lr 1e-5, 5 epochs, batch 32 on forget10's 400 QA (~60 steps). A
# 10-author world has one forget author (20 QA): one step an epoch at batch 32, so the budget is counted
# in steps instead (batch 4: 5 steps an epoch, 10 epochs = 50 steps at most; a sweep rule stops early) at
# lr 5e-5, the scale of the fine-tuning that made the target (SmolLM2 preset: 3e-4).
_TEXT_DIR = dict(epochs=10, lr=5e-5, batch_size=4, grad_accum=1, weight_decay=0.01)


@dataclass(frozen=True)
class BaselineConfig(PresetConfig):
    """Hyperparameters of an optimisation method (defaults follow the TOFU reference settings for real
    checkpoints; the tiny presets memorise with large steps and unlearn at that scale)."""

    epochs: int = opt(5, "Passes over the forget set (with a sweep rule: the most; it stops early).")
    lr: float = opt(1e-5, "Learning rate (AdamW, linear decay).")
    batch_size: int = opt(32, "Forget (and paired retain) examples per step.")
    grad_accum: int = opt(1, "Gradient accumulation steps.")
    weight_decay: float = opt(0.01, "AdamW weight decay.")
    alpha: float = opt(1.0, "Weight of the retain term (GradDiff, KL, NPO, SimNPO).")
    gamma: float = opt(1.0, "Weight of the forget term (GradDiff, KL, NPO, SimNPO).")
    beta: float = opt(0.1, "Inverse temperature of NPO / SimNPO.")
    delta: float = opt(0.0, "SimNPO margin on the length-normalised forget NLL.")
    seed: int = opt(0, "Seed of the data order.")
    extra: dict[str, Any] = opt(help="Method-specific extras.", factory=dict)

    PRESETS: ClassVar[dict] = {
        ("text", "micro"): dict(epochs=5, lr=5e-4, batch_size=8, weight_decay=0.0),
        ("text", "mini"): dict(epochs=10, lr=1e-3, batch_size=16, weight_decay=0.0),
        ("text", "model_dir"): _TEXT_DIR,
        ("speaker", "tiny"): dict(epochs=2, lr=1e-3, batch_size=8, weight_decay=0.0),
        ("speaker", "small"): dict(epochs=5, lr=1e-4, batch_size=16, weight_decay=0.0),
        ("speaker", "large"): dict(epochs=5, lr=5e-5, batch_size=16, weight_decay=0.0),
        ("speech-llm", "tiny"): dict(epochs=5, lr=2e-4, batch_size=16, weight_decay=0.0),
        ("speech-llm", "mini"): dict(epochs=5, lr=2e-4, batch_size=16, weight_decay=0.0),
        ("speech-llm", "model_dir"): _TEXT_DIR,
    }


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
