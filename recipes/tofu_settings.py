"""Per-preset default settings of every unlearning method in the TOFU recipes.

Real checkpoints use the TOFU reference settings (lr 1e-5, 5 epochs, effective batch 32); the
tiny presets, trained with lr 2e-3 to memorise their data, need proportionally larger steps.
Sweeps choose rank/scale (erasure) and temperature (T3) with the training-partition rule:
raise the forget NLL to the base model's level (the model before it ever saw the forget
authors) while the retain NLL rises by at most ``retain_bound`` nats.
"""

from __future__ import annotations

from dataclasses import replace

from mmunlearn.baselines import BaselineConfig
from mmunlearn.taskvec.extract import ExtractConfig
from mmunlearn.methods.erase_method import EraseMethodConfig
from mmunlearn.methods.registry import MethodSettings

BASELINE = {
    "micro": BaselineConfig(epochs=5, lr=5e-4, batch_size=8, weight_decay=0.0),
    # the mini models memorise with lr 2e-3; unlearning at that scale (as the reference unlearns at its
    # fine-tuning lr), stopped early by the sweep rule when --sweep is on
    "mini": BaselineConfig(epochs=10, lr=1e-3, batch_size=16, weight_decay=0.0),
    "model_dir": BaselineConfig(epochs=5, lr=1e-5, batch_size=8, grad_accum=4, weight_decay=0.01),
}
EXTRACT = {
    "micro": ExtractConfig(kind="finetune", steps=20, lr=1e-3, batch_size=8),
    "mini": ExtractConfig(kind="finetune", steps=40, lr=5e-4, batch_size=16),
    "model_dir": ExtractConfig(kind="finetune", steps=50, lr=1e-5, batch_size=8),
}
ERASE = {
    "micro": EraseMethodConfig(rank=8, retain_rank=32, scale=2.0),
    "mini": EraseMethodConfig(rank=32, retain_rank=128, scale=2.0),
    "model_dir": EraseMethodConfig(rank=32, retain_rank=128, scale=1.0),
}
T3 = {
    "micro": {"rank": 8, "epochs": 60, "lr": 2e-2, "temperature": 1.0},
    "mini": {"rank": 20, "epochs": 100, "lr": 1e-2, "temperature": 1.0},
    "model_dir": {"rank": 20, "epochs": 100, "lr": 1e-2, "temperature": 1.0},
}
SWEEP_SCALES = "auto"  # doubling from 0.25 until the forget target or the retain bound is crossed
SWEEP_TEMPERATURES = [1.0, 1.25, 1.5, 2.0]


def preset_kind(preset: str) -> str:
    return preset if preset in ("micro", "mini") else "model_dir"


def method_settings(preset: str, *, rank: int | None = None, scale: float | None = None, extract_kind: str | None = None,
                    extract_steps: int | None = None, temperature: float | None = None, t3_rank: int | None = None,
                    lr: float | None = None, epochs: int | None = None, cache_dir: str | None = None,
                    progress: bool = True) -> MethodSettings:
    """The defaults of ``preset`` with the user's overrides applied."""
    kind = preset_kind(preset)
    extract = EXTRACT[kind]
    if extract_kind is not None:
        extract = replace(extract, kind=extract_kind)
    if extract_steps is not None:
        extract = replace(extract, steps=extract_steps)
    erase = replace(ERASE[kind], extract=extract)
    if rank is not None:
        erase = replace(erase, rank=rank)
    if scale is not None:
        erase = replace(erase, scale=scale)
    baseline = BASELINE[kind]
    if lr is not None:
        baseline = replace(baseline, lr=lr)
    if epochs is not None:
        baseline = replace(baseline, epochs=epochs)
    t3 = dict(T3[kind])
    if temperature is not None:
        t3["temperature"] = temperature
    if t3_rank is not None:
        t3["rank"] = t3_rank
    return MethodSettings(erase=erase, baseline=baseline, t3=t3, cache_dir=cache_dir, progress=progress)


def add_sweeps(settings: MethodSettings, forget_target: float, retain_bound: float,
               ranks: list[int] | None = None) -> MethodSettings:
    """Turn on the rank/scale and temperature sweeps with the training-partition rule."""
    settings.erase_sweep = {"ranks": ranks or [settings.erase.rank], "scales": SWEEP_SCALES,
                            "forget_target": forget_target, "retain_bound": retain_bound}
    settings.t3_sweep = {"temperatures": SWEEP_TEMPERATURES, "forget_target": forget_target,
                         "retain_bound": retain_bound}
    settings.baseline_sweep = {"forget_target": forget_target, "retain_bound": retain_bound}
    return settings
