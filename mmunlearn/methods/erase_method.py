"""QR-Erase and SVD-UNLEARN as unlearning methods: task vectors -> localise -> basis -> discriminate -> erase.

Task vectors are taken from a reference point (``base``): the model the target was fine-tuned
from (subtracting the forget-specific part of the update undoes that learning), or the target
itself (subtracting the update that pushes it further into the forget data pushes it away).
An optional sweep picks rank and scale with a criterion on the training partitions only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmunlearn.erase import erase, restore
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices


@dataclass(frozen=True)
class EraseMethodConfig:
    """Settings of a subspace-erasure method."""

    method: str = "cpqr"  # cpqr (QR-Erase) | svd (UNLEARN) | any column_basis method
    localize: bool = True
    rule: str = "mean"
    rank: int | None = 32
    energy: float | None = None
    retain_rank: int | None = 128
    rows: bool = False  # also remove the retain row space
    scale: float = 1.0
    extract: ExtractConfig = field(default_factory=ExtractConfig)


@dataclass
class SweepPoint:
    rank: int | None
    scale: float
    forget_nll: float
    retain_nll: float


@dataclass
class EraseOutcome:
    report: Any  # EraseReport of the applied edit
    extract_seconds: float
    erase_seconds: float
    sweep: list[SweepPoint] = field(default_factory=list)
    chosen: dict = field(default_factory=dict)


def task_vectors(adapter, forget: Sequence[Any], retain: Sequence[Any], cfg: ExtractConfig, progress: bool = True):
    """Forget and retain task matrices from the same recipe and settings."""
    tf = extract_task_matrices(adapter, forget, cfg, progress=progress)
    tr = extract_task_matrices(adapter, retain, cfg, progress=progress)
    return tf, tr


def _erase(model, tf, tr, cfg: EraseMethodConfig, rank, scale, groups=None):
    common = dict(method=cfg.method, localize=cfg.localize, rule=cfg.rule, scale=scale, rows=cfg.rows, groups=groups)
    if rank is None:
        return erase(model, tf, tr, energy=cfg.energy, retain_energy=cfg.energy, **common)
    retain = tr if cfg.retain_rank else None
    return erase(model, tf, retain, rank=rank, retain_rank=cfg.retain_rank, clamp_ranks=True, **common)


#: ``scales="auto"``: double the scale from 0.25 until the rule's target or bound is crossed.
AUTO_SCALES = tuple(0.25 * 2**i for i in range(17))


def _scales(spec):
    return AUTO_SCALES if spec == "auto" else spec


def mean_nll(adapter, items: Sequence[Any], batch_size: int = 16) -> float:
    """Mean per-example NLL (length-normalised) of the targets of ``items`` under ``adapter``."""
    if hasattr(adapter, "answer_nll"):
        return float(adapter.answer_nll(items, batch_size=batch_size).mean())
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(items), batch_size):
            batch = adapter.collate(items[i : i + batch_size])
            total += float(-adapter.sequence_logprob(batch, average=True).sum())
    return total / len(items)


def choose(points: list[SweepPoint], base_forget: float, base_retain: float, forget_target: float,
           retain_bound: float) -> SweepPoint:
    """The sweep rule: among points whose retain NLL rose by at most ``retain_bound``, the first
    (smallest edit) that raises the forget NLL to ``forget_target``; if none does, the one with
    the highest forget NLL; if none keeps retain within bound, the smallest edit."""
    ok = [p for p in points if p.retain_nll - base_retain <= retain_bound]
    if not ok:
        return points[0]
    reached = [p for p in ok if p.forget_nll >= forget_target]
    if reached:
        return min(reached, key=lambda p: p.retain_nll)
    return max(ok, key=lambda p: p.forget_nll)


def run_erase_method(target, forget: Sequence[Any], retain: Sequence[Any], cfg: EraseMethodConfig, *,
                     reference=None, sweep: dict | None = None, progress: bool = True) -> EraseOutcome:
    """Unlearn ``forget`` from ``target.model`` in place by subspace erasure.

    ``reference``: the adapter to take task vectors from (default: the target itself).
    ``sweep``: ``{"ranks": [...], "scales": [...], "forget_target": x, "retain_bound": y,
    "retain_items": [...]}``; each candidate is applied, scored on the training partitions,
    and undone with its undo patch; the chosen one is then applied. Optional ``"forget_measure"``
    / ``"retain_measure"``: ``f(adapter, items) -> float`` scoring each side in place of
    :func:`mean_nll` (e.g. a classifier's forget error rate); the rule of :func:`choose` is unchanged.
    """
    groups = target.groups() if hasattr(target, "groups") else None  # adapters that group layers themselves
    t0 = time.perf_counter()
    tf, tr = task_vectors(reference or target, forget, retain, cfg.extract, progress)
    extract_seconds = time.perf_counter() - t0
    rank, scale, points = cfg.rank, cfg.scale, []
    chosen: dict = {"rank": rank, "scale": scale}
    if sweep:
        check_retain = sweep.get("retain_items") or retain
        measure_f, measure_r = sweep.get("forget_measure", mean_nll), sweep.get("retain_measure", mean_nll)
        base_f, base_r = measure_f(target, forget), measure_r(target, check_retain)
        def score(r, s):
            rep = _erase(target.model, tf, tr, cfg, r, s, groups)
            points.append(SweepPoint(r, s, measure_f(target, forget), measure_r(target, check_retain)))
            restore(target.model, rep)
            p = points[-1]
            return p.forget_nll >= sweep["forget_target"], p.retain_nll - base_r > sweep["retain_bound"]

        for r in sweep.get("ranks") or [cfg.rank]:
            good = None
            for s in _scales(sweep["scales"]):
                reached, over = score(r, s)
                if sweep["scales"] != "auto":
                    continue
                if reached or over:  # larger scales only go further past the target or the bound
                    lo, hi = good, s
                    for _ in range(2 if lo is not None else 0):  # geometric bisection of the crossing
                        mid = (lo * hi) ** 0.5
                        reached, over = score(r, mid)
                        lo, hi = (lo, mid) if (reached or over) else (mid, hi)
                    break
                good = s
        best = choose(points, base_f, base_r, sweep["forget_target"], sweep["retain_bound"])
        rank, scale = best.rank, best.scale
        chosen = {"rank": rank, "scale": scale, "base_forget_nll": base_f, "base_retain_nll": base_r,
                  "forget_target": sweep["forget_target"], "retain_bound": sweep["retain_bound"]}
    t1 = time.perf_counter()
    report = _erase(target.model, tf, tr, cfg, rank, scale, groups)
    return EraseOutcome(report, extract_seconds, time.perf_counter() - t1, points, chosen)


def changed_fraction(before: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    """Fraction of the model's parameters whose value differs from ``before``."""
    changed = total = 0
    for name, p in model.state_dict().items():
        if name in before:
            changed += int((p != before[name]).sum())
            total += p.numel()
    return changed / total if total else 0.0
