"""QR-Erase on any ``nn.Module`` (or state dict): localise, build bases, discriminate, subtract.

For each selected layer group and each of its matrices W with forget task matrix T_f:
Q_f = column_basis(T_f), Q_r = column_basis(T_r), T~ = (I - Q_r Q_r^T) Q_f Q_f^T T_f and
W' = W - scale * T~. Every input is validated before any weight is touched (including that no
edited weight would become NaN or Inf), an edit larger than :data:`~mmunlearn.erase.report.LARGE_UPDATE`
times the weights it changes is logged as a warning and flagged in the report, and an undo patch
lets ``restore`` give back the original weights bit for bit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmunlearn.erase.energy import group_of, layer_energy, select_layers
from mmunlearn.erase.norms import all_finite
from mmunlearn.erase.options import EraseOptions
from mmunlearn.erase.patch import PatchEntry, UndoPatch, apply_exact, delta, revert_exact
from mmunlearn.erase.report import LARGE_UPDATE, EraseReport, LayerRow, MatrixRow
from mmunlearn.erase.subspace.basis import METHODS, column_basis
from mmunlearn.erase.subspace.discriminate import discriminate_factors
from mmunlearn.erase.views import ParamTable, task_matrices_for
from mmunlearn.errors import NonFiniteError
from mmunlearn.files import layout
from mmunlearn.taskvec.lowrank import LowRank

log = logging.getLogger(__name__)

PATCH_NAME = layout.PATCH_NAME  # output names live in mmunlearn.files.layout (reserved: no input file may use them)
REPORT_NAME = layout.ERASE_REPORT

Model = nn.Module | Mapping[str, torch.Tensor]


def _check_rank(rank: int | None, label: str, shape: tuple[int, ...], what: str) -> None:
    if rank is not None and rank > min(shape):
        raise ValueError(f"{what} rank {rank} exceeds min(m, n) = {min(shape)} of {label} {tuple(shape)}")


#: The dtypes erase computes in (float8 has no linear algebra in torch; a complex edit is not defined).
EDITABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_float(what: str, t, name: str) -> None:
    dtype = t.dtype
    if dtype not in EDITABLE:
        raise ValueError(
            f"{what} {name!r} has dtype {str(dtype).replace('torch.', '')}; expected floating point (float16, "
            "bfloat16, "
            "float32 or float64)"
        )


def _plan(params: ParamTable, forget: Mapping, retain: Mapping | None, rank, retain_rank):
    """Validate every input and pair each matrix view with its task matrices."""
    plan: dict[str, list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]] = {}
    for name, T in forget.items():
        param, kind = params.get(name)
        _check_float("model parameter", param, name)
        if not isinstance(T, LowRank):
            _check_float("forget task matrix for", T, name)
        if retain is not None and name in retain and not isinstance(retain[name], LowRank):
            _check_float("retain task matrix for", retain[name], name)
        if not all_finite(param):
            raise ValueError(f"model parameter {name!r} contains NaN or Inf values")
        views = dict(params.views(name))
        tf = task_matrices_for(name, T, param, kind)
        tr = [None] * len(tf)
        if retain is not None:
            if name not in retain:
                raise KeyError(f"retain task matrices have no entry for {name!r}")
            tr = [t for _, t in task_matrices_for(name, retain[name], param, kind)]
        rows = []
        for (label, t), r in zip(tf, tr):
            for what, mat in (("forget", t), ("retain", r)):
                if mat is not None and not all_finite(mat):
                    raise ValueError(f"{what} task matrix for {label!r} contains NaN or Inf values")
            _check_rank(rank, label, t.shape, "forget")
            if r is not None:
                _check_rank(retain_rank, label, r.shape, "retain")
            rows.append((label, views[label], t, r))
        plan[name] = rows
    return plan


def _check_update_finite(label: str, view: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: float) -> None:
    """Raise NonFiniteError if W - A @ B (in W's dtype) would hold NaN or Inf.

    A bound first: |(A B)_ij| <= ||A_i|| ||B^j||, so max|W| + max_i ||A_i|| max_j ||B^j|| below the
    dtype's largest value proves every entry finite; only otherwise is the edit computed to check.
    """
    W = view.detach()
    if W.numel() == 0 or A.numel() == 0:
        return
    info = torch.finfo(W.dtype)
    lo, hi = torch.aminmax(W)
    w_max = max(abs(float(lo)), abs(float(hi)))
    bound = w_max + float(torch.linalg.vector_norm(A, dim=1).max()) * float(torch.linalg.vector_norm(B, dim=0).max())
    if math.isfinite(bound) and bound < info.max * (1 - 2 * info.eps):
        return
    new = W.to("cpu") - delta(A, B, W.dtype)
    if not bool(torch.isfinite(new).all()):
        raise NonFiniteError(
            f"the edit of {label} would write NaN or Inf weights ({str(W.dtype).replace('torch.', '')} "
            f"overflows at scale {scale:g}); nothing was changed: lower the scale"
        )


def erase(
    model: Model,
    forget: Mapping[str, torch.Tensor],
    retain: Mapping[str, torch.Tensor] | None = None,
    *,
    out: str | os.PathLike | None = None,
    groups: Mapping[str, str] | Callable[[str], str] | None = None,
    factors: dict | None = None,
    **options: Any,
) -> EraseReport:
    """Erase the forget task's subspace from ``model`` in place.

    Args:
        model: an ``nn.Module`` or a state dict; keys of ``forget`` name its parameters.
        forget: forget task matrices, parameter name -> tensor of the parameter's shape.
        retain: retain task matrices for the same names (None: no retain discrimination).
        out: directory for the undo patch and the JSON report (None: patch kept in memory).
        groups: parameter name -> layer group (mapping or function); default: block index.
        factors: a dict the update's factors are kept in, per matrix and every setting but the scale, and taken
            from on a later call with the same task matrices (a sweep over the scale computes each basis once).
        options: the fields of :class:`~mmunlearn.erase.options.EraseOptions` (rank or energy, method,
            localize, scale, rule / top / threshold, retain_rank / retain_energy, rows, seed, clamp_ranks).
    """
    start = time.perf_counter()
    o = EraseOptions.of(options).resolved()
    rank, method, localize, scale = o.rank, o.method, o.localize, o.scale
    rule, top, threshold, retain_rank, clamp_ranks = o.rule, o.top, o.threshold, o.retain_rank, o.clamp_ranks
    if method not in METHODS:
        raise ValueError(f"unknown subspace method {method!r}; choose one of {sorted(METHODS)}")
    if not forget:
        raise ValueError("no forget task matrices given")
    params = ParamTable(model)
    plan = _plan(params, forget, retain, None if clamp_ranks else rank, None if clamp_ranks else retain_rank)
    key = groups if callable(groups) else (lambda n: groups.get(n, group_of(n))) if groups else group_of
    energies = layer_energy(forget, key)
    chosen = set(select_layers(energies, rule, top=top, threshold=threshold) if localize else energies)

    # Compute every update before touching any weight.
    updates = [
        _matrix_update(name, label, view, t, r, o, factors)
        for name, items in plan.items()
        if key(name) in chosen
        for label, view, t, r in items
    ]
    for _, label, view, A, B, _ in updates:
        _check_update_finite(label, view, A, B, scale)
    patch, rows_by_name = _apply_updates(updates, key)

    layers = [
        LayerRow(layer=g, energy=e, selected=g in chosen, matrices=rows_by_name.get(g, [])) for g, e in energies.items()
    ]
    settings = o.report_settings(retain is not None)
    report = EraseReport(
        method=method, settings=settings, layers=layers, seconds=time.perf_counter() - start, patch=patch
    )
    if out is not None:
        out = Path(out)
        report.patch_path = str(patch.save(out / PATCH_NAME))
        report.to_json(out / REPORT_NAME)
    return report


_Update = tuple[str, str, torch.Tensor, torch.Tensor, torch.Tensor, MatrixRow]  # name, label, view, A, B, row


def _matrix_update(
    name: str,
    label: str,
    view: torch.Tensor,
    t: torch.Tensor,
    r: torch.Tensor | None,
    o: EraseOptions,
    factors: dict | None = None,
) -> _Update:
    """One matrix's update factors (the scale folded into A) and its report row; no weight is touched. ``factors``:
    the unscaled factors of earlier calls (see :func:`erase`), read and filled."""
    key = (label, o.rank, o.retain_rank, o.energy, o.retain_energy, o.method, o.seed, o.rows, o.clamp_ranks, r is None)
    if factors is not None and key in factors:
        A, B, row = factors[key]
        return (name, label, view, float(o.scale) * A, B, dataclasses.replace(row, seconds=0.0))
    rank, retain_rank, method, seed = o.rank, o.retain_rank, o.method, o.seed
    energy, retain_energy = o.energy, o.retain_energy
    t0 = time.perf_counter()
    cap = (lambda k, m: None if k is None else min(k, *m.shape)) if o.clamp_ranks else (lambda k, m: k)
    bf = column_basis(t, rank=cap(rank, t), energy=energy, method=method, seed=seed)
    Q_r = P_r = None
    k_r = 0
    if r is not None:
        br = column_basis(r, rank=cap(retain_rank, r), energy=retain_energy, method=method, seed=seed)
        Q_r, k_r = br.Q, br.k
        if o.rows:
            P_r = column_basis(r.T, rank=cap(retain_rank, r), energy=retain_energy, method=method, seed=seed).Q
    A, B = discriminate_factors(bf.Q, t.to(bf.Q.dtype), Q_r, P_r, coef=bf.coef)
    row = MatrixRow(
        name=label,
        shape=tuple(view.shape),
        rank_forget=bf.k,
        rank_retain=k_r,
        captured=bf.captured,
        norm_removed=0.0,
        rel_norm_removed=0.0,
        seconds=time.perf_counter() - t0,
    )
    A, B = A.double(), B.double()
    if factors is not None:
        factors[key] = (A, B, dataclasses.replace(row))
    return (name, label, view, float(o.scale) * A, B, row)


def _apply_updates(updates: list[_Update], key: Callable[[str], str]) -> tuple[UndoPatch, dict[str, list[MatrixRow]]]:
    """Apply the checked updates in order; the undo patch and the report rows by layer group."""
    patch = UndoPatch()
    rows_by_name: dict[str, list[MatrixRow]] = {}
    for name, label, view, A, B, row in updates:
        t0 = time.perf_counter()
        w_norm = float(torch.linalg.vector_norm(view.detach().double()))
        entry, removed = apply_exact(view, A, B, label)
        patch.entries.append(entry)
        row.norm_removed = removed
        row.rel_norm_removed = removed / w_norm if w_norm else 0.0
        row.seconds += time.perf_counter() - t0
        if row.rel_norm_removed > LARGE_UPDATE:
            log.warning(
                "large edit of %s: ||dW||/||W|| = %.3g > %g (check the scale and that the task matrices "
                "belong to this model)",
                label,
                row.rel_norm_removed,
                LARGE_UPDATE,
            )
        rows_by_name.setdefault(key(name), []).append(row)
    return patch, rows_by_name


def restore(model: Model, patch: UndoPatch | str | os.PathLike | EraseReport) -> None:
    """Undo an erase: the edited matrices return to their original bits.

    ``patch`` is an ``UndoPatch``, the path of a saved one, or the ``EraseReport`` of the erase.
    All matrices are checked before any is written, so a mismatched patch changes nothing.
    """
    if isinstance(patch, EraseReport):
        patch = patch.patch
    if isinstance(patch, (str, os.PathLike)):
        patch = UndoPatch.load(patch)
    if not isinstance(patch, UndoPatch):
        raise TypeError("patch must be an UndoPatch, its path, or an EraseReport")
    params = ParamTable(model)
    flat = model if isinstance(model, Mapping) else model.state_dict(keep_vars=True)
    views: dict[str, torch.Tensor] = {}
    for entry in patch.entries:
        name = entry.label.split("[", 1)[0]
        if entry.original is not None:  # a dense record: the tensor itself, of any shape
            if name not in flat:
                raise KeyError(f"the undo patch restores {name!r}, which the model does not hold")
            views[name] = flat[name].data if isinstance(flat[name], torch.nn.Parameter) else flat[name]
        else:
            views.update(params.views(name))
    for entry in patch.entries:
        if entry.label not in views:
            raise KeyError(f"the undo patch restores {entry.label!r}, which the model does not hold")
        _check_entry(entry, views[entry.label])
    try:
        originals = [(views[e.label], revert_exact(views[e.label], e)) for e in patch.entries]
    except RuntimeError as exc:  # the digests matched but the factors did not give the original back
        raise ValueError(f"{exc}: the undo patch is damaged") from exc
    with torch.no_grad():
        for view, original in originals:
            view.copy_(original.to(view.device))


def merge_erases(model: Model, first: EraseReport, second: EraseReport) -> EraseReport:
    """Two successive erases of ``model`` (``second`` made on top of ``first``) as one, so that one undo patch returns
    the original: both are undone, then every matrix gets both updates at once (its factors side by side,
    A = [A1 A2], B = [B1; B2]); the weights equal the two-step result up to float rounding. ``first``'s report with
    the merged patch and both times; low-rank undo records only (what ``erase`` writes)."""
    if first.patch is None or second.patch is None:
        raise ValueError("merge_erases needs both erases' undo patches in memory")
    parts: dict[str, list[PatchEntry]] = {}
    for entry in (*first.patch.entries, *second.patch.entries):
        if entry.original is not None:
            raise ValueError(f"{entry.label}: merge_erases merges low-rank undo records only, not a stored original")
        parts.setdefault(entry.label, []).append(entry)
    restore(model, second)
    restore(model, first)
    params = ParamTable(model)
    views: dict[str, torch.Tensor] = {}
    for label in parts:
        views.update(params.views(label.split("[", 1)[0]))
    patch = UndoPatch()
    for label, entries in parts.items():
        A = torch.cat([e.A for e in entries], dim=1)
        B = torch.cat([e.B for e in entries], dim=0)
        patch.entries.append(apply_exact(views[label], A, B, label)[0])
    return dataclasses.replace(first, patch=patch, seconds=first.seconds + second.seconds)


def _check_entry(entry: PatchEntry, view: torch.Tensor) -> None:
    """An undo record must fit the tensor it restores (a corrupt or foreign patch fails here, readably)."""
    if entry.original is not None:
        if tuple(entry.original.shape) != tuple(view.shape) or entry.original.dtype != view.dtype:
            raise ValueError(
                f"the undo patch stores {entry.label} as {tuple(entry.original.shape)} "
                f"{entry.original.dtype}, the model has {tuple(view.shape)} {view.dtype}"
            )
        return
    A, B, idx, val = entry.A, entry.B, entry.fix_idx, entry.fix_val
    m, n = view.shape
    ok = (
        A.dim() == 2
        and B.dim() == 2
        and A.shape[0] == m
        and B.shape[1] == n
        and A.shape[1] == B.shape[0]
        and A.dtype.is_floating_point
        and B.dtype.is_floating_point
        and idx.dim() == 1
        and val.dim() == 1
        and idx.shape == val.shape
        and not idx.dtype.is_floating_point
        and idx.dtype != torch.bool
        and (idx.numel() == 0 or (int(idx.min()) >= 0 and int(idx.max()) < m * n))
    )
    if not ok:
        raise ValueError(
            f"the undo patch entry for {entry.label} does not fit its {m} x {n} matrix "
            f"(A {tuple(A.shape)}, B {tuple(B.shape)}, {idx.numel()} fixes): corrupt or for another model"
        )
