"""A task matrix kept as low-rank factors, T = B @ A (a LoRA update), never materialised unless asked.

The erase path reads only what it needs from the factors: the squared norm from two r x r Gram
matrices, the column space from B alone (range(B A) is within range(B)), and Q^T T as (Q^T B) A.

>>> T = LowRank(torch.ones(6, 2), torch.ones(2, 4))
>>> T.shape, T.rank, T.dense().shape
(torch.Size([6, 4]), 2, torch.Size([6, 4]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LowRank:
    """T = B @ A with B: m x r (any scaling folded in) and A: r x n."""

    B: torch.Tensor
    A: torch.Tensor

    def __post_init__(self) -> None:
        if self.B.dim() != 2 or self.A.dim() != 2 or self.B.shape[1] != self.A.shape[0]:
            raise ValueError(
                f"LowRank needs B (m x r) and A (r x n), got {tuple(self.B.shape)} and {tuple(self.A.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.B.shape[0], self.A.shape[1]))

    @property
    def rank(self) -> int:
        return self.B.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return torch.promote_types(self.B.dtype, self.A.dtype)

    @property
    def device(self) -> torch.device:
        return self.B.device

    @property
    def T(self) -> LowRank:
        return LowRank(self.A.T, self.B.T)

    def dim(self) -> int:
        return 2

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def detach(self) -> LowRank:
        return LowRank(self.B.detach(), self.A.detach())

    def to(self, *args, **kwargs) -> LowRank:
        return LowRank(self.B.to(*args, **kwargs), self.A.to(*args, **kwargs))

    def cpu(self) -> LowRank:
        return self.to("cpu")

    def dense(self) -> torch.Tensor:
        """The full m x n matrix (m*n memory: only when something needs it)."""
        return self.B @ self.A

    def sq_norm(self) -> float:
        """||B A||_F^2 = sum((B^T B) * (A A^T)), from r x r matrices, in float64."""
        B, A = self.B.double(), self.A.double()
        return float(((B.T @ B) * (A @ A.T)).sum())

    def is_finite(self) -> bool:
        return bool(torch.isfinite(self.B).all() and torch.isfinite(self.A).all())

    def __rmatmul__(self, M: torch.Tensor) -> torch.Tensor:
        """M @ T as (M @ B) @ A (e.g. Q^T T with k x m Q^T)."""
        return (M @ self.B.to(M.dtype)) @ self.A.to(M.dtype)
