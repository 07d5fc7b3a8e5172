"""RMU (representation misdirection for unlearning; Li et al., 2024, "The WMDP benchmark", arXiv:2403.03218).

At one decoder layer l, forget activations are steered towards a fixed random direction c * u while
retain activations are kept where the frozen model puts them; only the MLPs of layers l-2 .. l train:

    L = mean_f ||h_l(x) - c u||^2 + alpha * mean_r ||h_l(x) - h_l^frozen(x)||^2

over answer tokens. ``steering`` sets c in units of the frozen model's mean activation norm at layer l on
the forget set (the paper fixes c per model; a relative scale carries over between model sizes). With a
sweep rule training stops early, as for the optimisation methods.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.config import PresetConfig, opt
from mmunlearn.methods.base import MethodResult, RunContext, register
from mmunlearn.methods.rule import early_stop
from mmunlearn.train import TrainConfig, train


@dataclass(frozen=True)
class RMUConfig(PresetConfig):
    """Settings of RMU."""

    layer: int | None = opt(None, "Decoder layer l whose activations are steered (default: a third of the depth).")
    steering: float = opt(4.0, "c in units of the frozen model's mean activation norm at layer l (forget set).")
    alpha: float = opt(10.0, "Weight of the retain term.")
    epochs: int = opt(5, "Passes over the forget set (with a sweep rule: the most; it stops early).")
    lr: float = opt(5e-5, "Learning rate (AdamW) of the updated MLPs.")
    batch_size: int = opt(8, "Forget (and paired retain) examples per step.")
    seed: int = opt(0, "Seed of the random direction and the data order.")

    PRESETS: ClassVar[dict] = {
        ("text", "micro"): dict(lr=1e-3, epochs=5),
        ("text", "mini"): dict(lr=5e-4, epochs=5),
        ("speech-llm", "tiny"): dict(lr=1e-3),
        ("speech-llm", "mini"): dict(lr=5e-4),
    }


def _acts(adapter, model, batch, tap: HiddenStateTap) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-l activations at the answer positions (N x d) of ``batch`` under ``model``."""
    logits, targets = adapter.logits(batch, model)  # runs the forward pass; the tap keeps layer l's output
    mask = targets != -100  # answer tokens, predicted from position t (states aligned with logits)
    return tap.states[:, : mask.shape[1]][mask], mask


def run(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: RMUConfig, ctx: RunContext) -> MethodResult:
    """Steer the forget activations of one layer to a random direction; keep the retain ones."""
    start = time.perf_counter()
    model = adapter.model
    try:
        layers = adapter.decoder_layers(model)
    except ValueError as e:
        raise ValueError(f"RMU needs a decoder with .layers: {e}") from None
    layer_idx = cfg.layer if cfg.layer is not None else min(len(layers) - 1, len(layers) // 3)
    if not 0 <= layer_idx < len(layers):
        raise ValueError(f"RMU layer {layer_idx} is outside the decoder's {len(layers)} layers")
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    tap, frozen_tap = HiddenStateTap(layers[layer_idx]), HiddenStateTap(adapter.decoder_layers(frozen)[layer_idx])
    updated = list(range(max(0, layer_idx - 2), layer_idx + 1))  # the steered layer and up to two below it
    params = [p for i in updated for n, p in layers[i].named_parameters() if "mlp" in n]
    if not params:
        raise ValueError(f"RMU found no MLP parameters in decoder layers {updated[0]}..{layer_idx}")
    try:
        with torch.no_grad():
            probe = adapter.collate(list(forget[: cfg.batch_size]))
            h, _ = _acts(adapter, frozen, probe, frozen_tap)
            norm = float(h.norm(dim=-1).mean())
        g = torch.Generator().manual_seed(cfg.seed)
        u = torch.rand(h.shape[-1], generator=g)
        control = (cfg.steering * norm * u / u.norm()).to(h.device, h.dtype)

        def loss_fn(m, f_batch, r_batch):
            hf, _ = _acts(adapter, m, f_batch, tap)
            hr, _ = _acts(adapter, m, r_batch, tap)
            with torch.no_grad():
                hr0, _ = _acts(adapter, frozen, r_batch, frozen_tap)
            return ((hf - control) ** 2).sum(-1).mean() / norm**2 + cfg.alpha * ((hr - hr0) ** 2).sum(
                -1
            ).mean() / norm**2

        on_step, trajectory, scorer = None, [], None
        if ctx.rule is not None:
            per_epoch = max(1, math.ceil(len(forget) / cfg.batch_size))
            on_step, trajectory, scorer = early_stop(adapter, forget, retain, ctx.rule, per_epoch)
        res = train(
            model,
            loss_fn,
            list(forget),
            adapter.collate,
            TrainConfig(
                epochs=cfg.epochs,
                lr=cfg.lr,
                batch_size=cfg.batch_size,
                weight_decay=0.0,
                schedule="constant",
                seed=cfg.seed,
            ),
            data2=list(retain),
            params=params,
            progress=ctx.progress,
            desc="rmu",
            on_step=on_step,
        )
    finally:
        tap.remove()
        frozen_tap.remove()
    model.eval()
    restored = on_step.restore_in_bound() if on_step is not None else None
    info = {
        "layer": layer_idx,
        "updated_layers": updated,
        "control_norm": float(control.norm()),
        "final_loss": res.final_loss,
        "steps": res.steps,
    }
    if restored is not None:
        info["restored_step"] = restored  # the run crossed the retain bound: the in-bound state is kept
    if trajectory:
        info["sweep"] = trajectory
    if scorer is not None:
        info["rule_seconds"] = scorer.seconds  # of the unlearn time: scoring the rule's measures
    return MethodResult(adapter, 0.0, time.perf_counter() - start, info)


register(
    "rmu",
    RMUConfig,
    run,
    kinds=("text", "speech-llm"),
    help="Representation misdirection: steer one layer's forget activations to a random direction.",
)
