"""Relearning attack: a few fine-tuning steps on a small part of the forget set (or on retain data only)
and the recovery of the rest of the forget set.

After Lynch et al. 2024 ("Eight methods to evaluate robust unlearning in LLMs") and Hu et al. 2024 ("Jogging
the memory of unlearned LLMs through targeted relearning attacks"): knowledge that was only suppressed comes
back after a handful of steps on related data, knowledge that is gone has to be learnt again. The reference
is the retain model (it never saw the forget data) relearning with the same data, steps, learning rate and
order: a method whose forget measures after the attack sit where the retain model's do is as robust as
retraining (:func:`mmunlearn.audit.measures.kept` = 1.0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from mmunlearn.audit.options import AuditOptions
from mmunlearn.train import TrainConfig, train


def _group(item: Any) -> Hashable:
    """Who an item is about: a TOFU author, a speaker (manifest row), or one shared group."""
    if isinstance(item, dict):
        return item.get("spk_id")
    return getattr(item, "author", None)


def split_forget(items: Sequence[Any], fraction: float) -> tuple[list[Any], list[Any]]:
    """(relearn part, test part): the first ``ceil(fraction * n)`` items of every author / speaker (at least
    one, and at least one left to test), so the attack touches every forgotten entity and is measured on
    facts (utterances) it did not train on; an author/speaker with a single item is only tested on. Order
    inside each group is kept."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    groups: dict[Hashable, list[Any]] = {}
    for it in items:
        groups.setdefault(_group(it), []).append(it)
    train, test = [], []
    for members in groups.values():
        if len(members) < 2:  # a lone item can only be tested on
            test += members
            continue
        k = min(len(members) - 1, max(1, math.ceil(fraction * len(members))))
        train += members[:k]
        test += members[k:]
    if not train:
        raise ValueError(
            "relearning needs an author/speaker with at least 2 forget items (one to train on, one to test on)"
        )
    return train, test


def relearned(
    adapter: Any,
    data: Sequence[Any],
    options: AuditOptions,
    *,
    train_mode: bool = True,
    progress: bool = True,
    desc: str = "relearn",
) -> Any:
    """A copy of ``adapter`` fine-tuned on ``data`` for ``options.relearn_steps`` steps (AdamW, constant
    rate, seeded order: every model sees the same batches); ``adapter`` itself is left unchanged.

    ``train_mode=False`` keeps dropout off and BatchNorm statistics frozen (speaker classifiers)."""
    twin = adapter.clone()
    cfg = TrainConfig(
        steps=options.relearn_steps,
        lr=options.relearn_lr,
        batch_size=min(options.relearn_batch_size, len(data)),
        schedule="constant",
        seed=options.seed,
    )
    train(
        twin.model,
        lambda m, b: twin.loss(b, m),
        list(data),
        twin.collate,
        cfg,
        device=str(twin.device),
        progress=progress,
        desc=desc,
        train_mode=train_mode,
    )
    twin.model.eval()
    return twin


def relearn_attack(
    models: dict[str, Any],
    train_items: Sequence[Any],
    test_items: Sequence[Any],
    measure: Callable[[Any, Sequence[Any], str], dict[str, float | None]],
    options: AuditOptions,
    *,
    train_mode: bool = True,
    before: dict[str, dict] | None = None,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Relearn every model of ``models`` (name -> adapter whose weights an attacker holds) on ``train_items``
    and measure ``test_items`` before and after; ``before``: measures already taken (skipped here).

    Returns ``{name: {"before": {...}, "after": {...}}}``; the ratios are the runner's (they need the
    target's and the retain model's results side by side)."""
    out = {}
    for name, adapter in models.items():
        start = (before or {}).get(name) or measure(adapter, test_items, f"{name} before relearning")
        twin = relearned(
            adapter, train_items, options, train_mode=train_mode, progress=progress, desc=f"relearn {name}"
        )
        out[name] = {"before": start, "after": measure(twin, test_items, f"{name} relearned")}
        del twin
    return out
