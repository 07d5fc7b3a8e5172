"""Run any registered baseline through the shared training loop (forget and retain batches paired)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from mmunlearn.baselines.base import REGISTRY, BaselineConfig, LossContext
from mmunlearn.train import TrainConfig, TrainResult, train


def unlearn(
    adapter,
    method: str,
    forget: Sequence[Any],
    retain: Sequence[Any] | None = None,
    config: BaselineConfig | None = None,
    *,
    progress: bool = True,
    **train_kwargs,
) -> TrainResult:
    """Unlearn ``forget`` from ``adapter.model`` in place with a named baseline.

    ``retain`` is required by every method but ``grad_ascent``. ``train_kwargs`` go to
    :func:`mmunlearn.train.train` (device, checkpointing, ...).
    """
    if method not in REGISTRY:
        raise ValueError(f"unknown baseline {method!r}; choose one of {sorted(REGISTRY)}")
    spec = REGISTRY[method]
    cfg = config or BaselineConfig()
    if len(forget) == 0:
        raise ValueError("the forget set is empty")
    if spec.needs_retain and not retain:
        raise ValueError(f"{method} needs a non-empty retain set")
    reference = None
    if spec.needs_reference:
        reference = copy.deepcopy(adapter.model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    ctx = LossContext(adapter, reference, cfg)
    tcfg = TrainConfig(
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        weight_decay=cfg.weight_decay,
        schedule="linear",
        warmup=0.0,
        seed=cfg.seed,
    )
    train_kwargs.setdefault("params", adapter.trainable_parameters())  # a speech LLM's --where tower only
    if spec.needs_retain:
        return train(
            adapter.model,
            lambda m, f, r: spec.loss(ctx, m, f, r),
            forget,
            adapter.collate,
            tcfg,
            data2=retain,
            progress=progress,
            desc=method,
            **train_kwargs,
        )
    return train(
        adapter.model,
        lambda m, f: spec.loss(ctx, m, f, None),
        forget,
        adapter.collate,
        tcfg,
        progress=progress,
        desc=method,
        **train_kwargs,
    )
