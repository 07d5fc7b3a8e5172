"""The settings of one erase, declared once: the in-memory erase, the streaming erase and the CLI read them here.

>>> EraseOptions(rank=8).resolved().retain_rank
8
>>> EraseOptions().resolved().energy
0.9
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from mmunlearn.config import opt
from mmunlearn.erase.energy import RULES


@dataclass(frozen=True)
class EraseOptions:
    """How the forget subspace is found, where it is removed and how strongly."""

    rank: int | None = opt(None, "Rank k of the forget basis per matrix.")
    energy: float | None = opt(
        None,
        "Instead of rank: smallest k capturing this fraction of each forget matrix's "
        "energy (0.9 when neither is given).",
    )
    method: str = opt("cpqr", "Subspace method: cpqr (QR-Erase), svd (UNLEARN baseline), or a faster variant.")
    localize: bool = opt(True, "Edit only the layers chosen by the layer rule (else every layer with a forget matrix).")
    scale: float = opt(1.0, "Edit strength: W' = W - scale * T~.")
    rule: str = opt("mean", "Layer selection: mean (energy >= 1/|L|), top (top N), threshold (minimum energy), all.")
    top: int | None = opt(None, "With rule top: number of most energetic layers to edit.")
    threshold: float | None = opt(None, "With rule threshold: minimum layer energy.")
    retain_rank: int | None = opt(None, "Rank of the retain basis (default: as the forget basis).")
    retain_energy: float | None = opt(None, "Energy fraction of the retain basis (default: as the forget basis).")
    rows: bool = opt(False, "Also remove the retain task's row space from the update.")
    seed: int = opt(0, "Seed of randomised subspace methods.")
    clamp_ranks: bool = opt(False, "Cap ranks at each matrix's min(m, n) instead of refusing a larger rank.")

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)):
            raise ValueError(f"scale must be a finite number, got {self.scale!r}")
        for name, low in (("rank", 1), ("top", 1), ("retain_rank", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        for name in ("energy", "retain_energy"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold}")

    @classmethod
    def of(cls, options: dict[str, Any]) -> EraseOptions:
        """Options from keyword arguments; an unknown name is an error that lists the known ones."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown erase options {unknown}; known: {sorted(names)}")
        return cls(**options)

    @staticmethod
    def help(name: str) -> str:
        """The help text of an option (the CLI shows it)."""
        return next(f.metadata["help"] for f in fields(EraseOptions) if f.name == name)

    def resolved(self) -> EraseOptions:
        """Defaults filled in: energy 0.9 when no size is given; the retain basis sized as the forget one."""
        out = self if self.rank is not None or self.energy is not None else replace(self, energy=0.9)
        if out.retain_rank is None and out.retain_energy is None:
            out = replace(out, retain_rank=out.rank, retain_energy=out.energy)
        return out

    def report_settings(self, retain: bool) -> dict[str, Any]:
        """The ``settings`` of an :class:`~mmunlearn.erase.report.EraseReport` (resolved values)."""
        return {
            "rank": self.rank,
            "energy": self.energy,
            "retain_rank": self.retain_rank,
            "retain_energy": self.retain_energy,
            "localize": self.localize,
            "rule": self.rule,
            "top": self.top,
            "threshold": self.threshold,
            "scale": self.scale,
            "rows": self.rows,
            "seed": self.seed,
            "retain": retain,
            "clamp_ranks": self.clamp_ranks,
        }
