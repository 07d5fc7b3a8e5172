"""Layer localisation: task energy per layer and the rule that picks the layers to edit.

E_l = ||T_f^l||_F / sum_j ||T_f^j||_F over layers l (a layer = a transformer block or a module
group; by default the prefix of a parameter name up to its first numeric component, so
``model.layers.3.mlp.up_proj.weight`` belongs to ``model.layers.3``). QR-Erase edits the layers
with E_l >= 1/|L| (rule ``mean``).

>>> import torch
>>> tm = {"m.layers.0.q.weight": torch.ones(2, 2), "m.layers.1.q.weight": 3 * torch.ones(2, 2)}
>>> e = layer_energy(tm)
>>> {k: round(v, 2) for k, v in e.items()}
{'m.layers.0': 0.25, 'm.layers.1': 0.75}
>>> select_layers(e)
['m.layers.1']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from mmunlearn.erase.norms import all_finite, sq_norm
from mmunlearn.naming import group_of  # re-exported: mmunlearn.erase.energy.group_of as before

RULES = ("mean", "top", "threshold", "all")


def group_norms(
    task_matrices: Mapping[str, torch.Tensor],
    groups: Mapping[str, str] | Callable[[str], str] | None = None,
) -> dict[str, float]:
    """Frobenius norm of every layer group's task matrices taken together."""
    if not task_matrices:
        raise ValueError("no task matrices given")
    key = groups if callable(groups) else (lambda n: groups.get(n, group_of(n))) if groups else group_of
    sq: dict[str, float] = {}
    for name, T in task_matrices.items():
        if not all_finite(T):
            raise ValueError(f"task matrix {name!r} contains NaN or Inf values")
        g = key(name)
        sq[g] = sq.get(g, 0.0) + sq_norm(T.detach())
    return {g: math.sqrt(v) for g, v in sq.items()}


def layer_energy(
    task_matrices: Mapping[str, torch.Tensor],
    groups: Mapping[str, str] | Callable[[str], str] | None = None,
) -> dict[str, float]:
    """E_l = ||T^l||_F / sum_j ||T^j||_F per layer group, in first-seen order; sums to 1."""
    norms = group_norms(task_matrices, groups)
    total = sum(norms.values())
    if total == 0.0:
        raise ValueError("every task matrix is zero: there is nothing to localise")
    return {g: v / total for g, v in norms.items()}


def select_layers(
    energies: Mapping[str, float],
    rule: str = "mean",
    *,
    top: int | None = None,
    threshold: float | None = None,
) -> list[str]:
    """Layer groups to edit.

    Rules: ``mean`` (E_l >= 1/|L|, the QR-Erase rule), ``top`` (the ``top`` most energetic),
    ``threshold`` (E_l >= ``threshold``), ``all``. Passing ``top`` or ``threshold`` alone picks
    that rule. Raises if the selection would be empty.
    """
    if not energies:
        raise ValueError("no layer energies given")
    if top is not None and rule == "mean":
        rule = "top"
    if threshold is not None and rule == "mean":
        rule = "threshold"
    if rule not in RULES:
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {RULES}")
    if rule == "mean":
        cut = 1.0 / len(energies)
        chosen = [g for g, e in energies.items() if e >= cut * (1 - 1e-9)]
    elif rule == "top":
        if not isinstance(top, int) or top < 1:
            raise ValueError(f"rule 'top' needs top >= 1, got {top!r}")
        ranked = sorted(energies, key=lambda g: -energies[g])[:top]
        chosen = [g for g in energies if g in ranked]
    elif rule == "threshold":
        if threshold is None:
            raise ValueError("rule 'threshold' needs threshold=x")
        chosen = [g for g, e in energies.items() if e >= threshold]
    else:
        chosen = list(energies)
    if not chosen:
        raise ValueError(f"rule {rule!r} selected no layer (max energy {max(energies.values()):.4f})")
    return chosen
