"""The T3 tilt head: a low-rank map from a hidden state to log f(x, y_<t, v) for every token v.

f estimates P(retain | x, y): a head logit z_v = (h A) B_v + b_v per vocabulary entry and
log f = log sigmoid(z). Rank h (default 20) keeps it tiny: d*h + h*V + V parameters, so one
matmul scores every candidate token at a decoding step.

The head reads the final hidden state of the position being extended (``pooling="last"``, the T3 paper's form) or
the mean of the final hidden states of every position up to it (``"cummean"``: the token-level head of
open-unlearning's T3 port, on cumulatively mean-pooled last-layer states); :func:`pool_states` computes either.

>>> import torch
>>> head = TiltHead(hidden=16, vocab=50, rank=4)
>>> head.log_f(torch.randn(2, 3, 16)).shape
torch.Size([2, 3, 50])
>>> head.log_f_of(torch.randn(5, 16), torch.tensor([0, 1, 2, 3, 4])).shape
torch.Size([5])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: log f at even odds, log sigmoid(0) = -log 2: about what a trained head says of a token no training answer held (its
#: bias stays 0, its row of B at the small random init), and the floor of a spared token's log f
#: (mmunlearn.tilt.processor.tilt_logprobs).
UNSEEN_LOG_F = -math.log(2.0)
#: What a head reads: the last position's state, or the mean of the states up to it.
POOLINGS: tuple[str, ...] = ("last", "cummean")


def check_pooling(pooling: str) -> str:
    """``pooling`` if it is one of :data:`POOLINGS` (ValueError otherwise)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    return pooling


def pool_states(states: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """The head's input at every position (B x L x d) from the final hidden states: ``last`` the states themselves,
    ``cummean`` the mean over the unmasked positions up to each one (``mask`` B x L, 1 = a real token; padding is
    left out; a position before any real token gets zeros)."""
    if check_pooling(pooling) == "last":
        return states
    m = torch.ones(states.shape[:2], device=states.device) if mask is None else mask.to(states.device)
    m = m.to(states.dtype).unsqueeze(-1)
    return (states * m).cumsum(1) / m.cumsum(1).clamp(min=1.0)


class TiltHead(nn.Module):
    """Low-rank per-token retain classifier: hidden (d) -> rank (h) -> vocabulary logits (V), reading states pooled
    as ``pooling`` says (:func:`pool_states`)."""

    def __init__(self, hidden: int, vocab: int, rank: int = 20, pooling: str = "last"):
        super().__init__()
        if min(hidden, vocab, rank) < 1:
            raise ValueError(f"hidden, vocab and rank must be positive, got {hidden}, {vocab}, {rank}")
        self.pooling = check_pooling(pooling)
        self.A = nn.Linear(hidden, rank, bias=False)
        self.B = nn.Linear(rank, vocab, bias=True)
        nn.init.zeros_(self.B.weight)
        nn.init.zeros_(self.B.bias)  # starts as the zero head: log f constant, no tilt

    @property
    def config(self) -> dict:
        out = {"hidden": self.A.in_features, "vocab": self.B.out_features, "rank": self.A.out_features}
        return out if self.pooling == "last" else {**out, "pooling": self.pooling}  # older heads read as "last"

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
