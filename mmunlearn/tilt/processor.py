"""TemperThenTilt: the decoding-time form of T3 as a transformers ``LogitsProcessor``.

At each step it returns log_softmax(log_softmax(scores) / T + log f(h_t)), where h_t is the
final hidden state of the position being extended, captured by a forward hook on the base
model (``HiddenStateTap``). The processor already tempers, so ``generate`` must be called with
temperature 1 and no top-k/top-p warping, or the sampled distribution is no longer T3's;
``TiltedCausalLM.generate`` sets these for you.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LogitsProcessor

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.tilt.head import TiltHead


def tilt_logprobs(logits: torch.Tensor, states: torch.Tensor, head: TiltHead | None, temperature: float,
                  strength: float = 1.0) -> torch.Tensor:
    """Normalised T3 log-probs: log_softmax(log_softmax(logits) / T + lambda log f(states)).

    log_softmax(logits) differs from logits by a per-row constant, which the outer normalisation
    removes, so one log_softmax of logits / T + lambda log f suffices. ``strength`` lambda in [0, 1]
    weakens the tilt (0: tempering alone; 1: the T3 distribution).
    """
    out = logits.float() / temperature if temperature != 1.0 else logits.float()
    if head is not None and strength != 0.0:
        out = out + strength * head.log_f(states).float()
    return torch.log_softmax(out, -1)


def check_strength(strength: float) -> float:
    """A tilt strength lambda must lie in [0, 1] (beyond 1 it would sharpen the tilt past the head's estimate)."""
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"tilt strength must be in [0, 1], got {strength}")
    return float(strength)


class TemperThenTilt(LogitsProcessor):
    """``scores -> log_softmax(log_softmax(scores) / T + log f(h_t))``; reads h_t from a tap."""

    def __init__(self, head: TiltHead | None, tap: HiddenStateTap, temperature: float = 1.0, strength: float = 1.0):
        if not temperature >= 1.0:
            raise ValueError(f"T3 tempers with T >= 1, got temperature={temperature}")
        self.head, self.tap, self.temperature = head, tap, float(temperature)
        self.strength = check_strength(strength)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.tap.states is None:
            raise RuntimeError("no hidden state captured: the tap is not on the generating model")
        return tilt_logprobs(scores, self.tap.states[:, -1], self.head, self.temperature, self.strength)
