"""Optimisation baselines, one short loss each, sharing one training loop: GradAscent, GradDiff,
KL-minimisation, NPO, SimNPO. ``unlearn(adapter, name, forget, retain, config)`` runs one."""

from mmunlearn.baselines import grad_ascent, grad_diff, kl, npo, simnpo  # noqa: F401  (register)
from mmunlearn.baselines.base import REGISTRY, BaselineConfig, register
from mmunlearn.baselines.runner import unlearn

__all__ = ["REGISTRY", "BaselineConfig", "register", "unlearn"]
