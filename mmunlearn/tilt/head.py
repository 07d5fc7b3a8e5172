"""The T3 tilt head: a low-rank map from a hidden state to log f(x, y_<t, v) for every token v.

f estimates P(retain | x, y): a head logit z_v = (h A) B_v + b_v per vocabulary entry and
log f = log sigmoid(z). Rank h (default 20) keeps it tiny: d*h + h*V + V parameters, so one
matmul scores every candidate token at a decoding step.

>>> import torch
>>> head = TiltHead(hidden=16, vocab=50, rank=4)
>>> head.log_f(torch.randn(2, 3, 16)).shape
torch.Size([2, 3, 50])
>>> head.log_f_of(torch.randn(5, 16), torch.tensor([0, 1, 2, 3, 4])).shape
torch.Size([5])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TiltHead(nn.Module):
    """Low-rank per-token retain classifier: hidden (d) -> rank (h) -> vocabulary logits (V)."""

    def __init__(self, hidden: int, vocab: int, rank: int = 20):
        super().__init__()
        if min(hidden, vocab, rank) < 1:
            raise ValueError(f"hidden, vocab and rank must be positive, got {hidden}, {vocab}, {rank}")
        self.A = nn.Linear(hidden, rank, bias=False)
        self.B = nn.Linear(rank, vocab, bias=True)
        nn.init.zeros_(self.B.weight)
        nn.init.zeros_(self.B.bias)  # starts as the zero head: log f constant, no tilt

    @property
    def config(self) -> dict:
        return {"hidden": self.A.in_features, "vocab": self.B.out_features, "rank": self.A.out_features}

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits z (..., V) of P(retain) for every next token."""
        return self.B(self.A(h.to(self.A.weight.dtype)))

    def log_f(self, h: torch.Tensor) -> torch.Tensor:
        """log f for every candidate token (..., V)."""
        return F.logsigmoid(self(h))

    def logit_of(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """z for one given token per state (N,), without forming the N x V matrix."""
        low = self.A(h.to(self.A.weight.dtype))
        return (low * self.B.weight[tokens]).sum(-1) + self.B.bias[tokens]

    def log_f_of(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(self.logit_of(h, tokens))
