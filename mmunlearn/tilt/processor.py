"""TemperThenTilt: the decoding-time form of T3 as a transformers ``LogitsProcessor``.

At each step it returns log_softmax(log_softmax(scores) / T + log f(h_t)), where h_t is the
final hidden state of the position being extended, captured by a forward hook on the base
model (``HiddenStateTap``). The processor already tempers, so ``generate`` must be called with
temperature 1 and no top-k/top-p warping, or the sampled distribution is no longer T3's;
``TiltedCausalLM.generate`` sets these for you.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.tilt.head import UNSEEN_LOG_F, TiltHead


def tilt_logprobs(
    logits: torch.Tensor,
    states: torch.Tensor,
    head: TiltHead | None,
    temperature: float,
    strength: float = 1.0,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """Normalised T3 log-probs: log_softmax(log_softmax(logits) / T + lambda log f(states)).

    log_softmax(logits) differs from logits by a per-row constant, which the outer normalisation
    removes, so one log_softmax of logits / T + lambda log f suffices. ``strength`` lambda in [0, 1]
    weakens the tilt (0: tempering alone; 1: the T3 distribution). ``seen`` (bool, the shape of ``logits``): tokens
    spared, e.g. those already in the text (:func:`seen_tokens`): their log f is floored at
    :data:`~mmunlearn.tilt.head.UNSEEN_LOG_F`, so none is penalised beyond even odds (about what the head says of a
    token it never saw in training), and none is raised above what the head says (a floor of 0 favoured copying the
    prompt's words over the answer on SmolLM2 TOFU: "in the heart of the city" for "Athens").
    """
    out = logits.float() / temperature if temperature != 1.0 else logits.float()
    if head is not None and strength != 0.0:
        log_f = head.log_f(states).float()
        out = out + strength * (log_f if seen is None else torch.where(seen, log_f.clamp(min=UNSEEN_LOG_F), log_f))
    return torch.log_softmax(out, -1)


def seen_tokens(input_ids: torch.Tensor, mask: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """B x L x V booleans: entry (b, t, v) is True when token v occurs in row b at a position <= t that ``mask``
    (B x L, 1 = a real token) does not leave out; padding is never seen. Built from each token's first position
    (B x V), so no B x L x V index tensor is made."""
    length = input_ids.shape[1]
    pos = torch.arange(length, device=input_ids.device).expand_as(input_ids)
    if mask is not None:
        pos = pos.masked_fill(~mask.to(input_ids.device).bool(), length)  # padding: a position never reached
    first = torch.full((len(input_ids), vocab), length, dtype=torch.long, device=input_ids.device)
    first = first.scatter_reduce(1, input_ids, pos, "amin")
    return first.unsqueeze(1) <= torch.arange(length, device=input_ids.device).view(1, length, 1)


def check_strength(strength: float) -> float:
    """A tilt strength lambda must lie in [0, 1] (beyond 1 it would sharpen the tilt past the head's estimate)."""
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"tilt strength must be in [0, 1], got {strength}")
    return float(strength)


class TemperThenTilt(LogitsProcessor):
    """``scores -> log_softmax(log_softmax(scores) / T + log f(h_t))``; reads h_t from a tap. A ``cummean`` head reads
    the mean of the states so far: kept as a running sum over the steps (the prompt's padding, from ``prompt_mask``,
    left out), so each step costs one addition whether or not generate caches keys and values. ``spare_seen``: the
    tokens already in the row (prompt and answer so far, padding left out) are spared (:func:`tilt_logprobs`), as in
    the teacher-forced scores of :class:`~mmunlearn.tilt.model.TiltedCausalLM`."""

    def __init__(
        self,
        head: TiltHead | None,
        tap: HiddenStateTap,
        temperature: float = 1.0,
        strength: float = 1.0,
        prompt_mask: torch.Tensor | None = None,
        spare_seen: bool = False,
    ):
        if not temperature >= 1.0:
            raise ValueError(f"T3 tempers with T >= 1, got temperature={temperature}")
        self.head, self.tap, self.temperature = head, tap, float(temperature)
        self.strength = check_strength(strength)
        self.prompt_mask = prompt_mask
        self.spare_seen = bool(spare_seen)
        self._sum: torch.Tensor | None = None
        self._count: torch.Tensor | None = None
        self._seen = 0  # positions summed so far

    def _pooled(self, input_ids: torch.LongTensor, states: torch.Tensor) -> torch.Tensor:
        if self.head is None or self.head.pooling == "last":
            return states[:, -1]
        length = input_ids.shape[1]  # positions whose states exist after this step's forward
        if self._sum is None or states.shape[1] != length - self._seen:  # first step, or no cache: from scratch
            prompt = self.prompt_mask if self.prompt_mask is not None else torch.ones_like(input_ids[:, :0])
            prompt = prompt.to(states.device)
            mask = torch.cat(
                [prompt, torch.ones(len(states), length - prompt.shape[1], device=states.device, dtype=prompt.dtype)], 1
            )[:, -states.shape[1] :].to(states.dtype)
            self._sum = (states * mask.unsqueeze(-1)).sum(1)
            self._count = mask.sum(1, keepdim=True)
        else:
            self._sum = self._sum + states.sum(1)
            self._count = self._count + states.shape[1]
        self._seen = length
        return self._sum / self._count.clamp(min=1.0)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.tap.states is None:
            raise RuntimeError("no hidden state captured: the tap is not on the generating model")
        seen = None
        if self.spare_seen:
            # (b, v): v occurs among row b's real tokens; amax, as a plain scatter of duplicates keeps any one
            seen = torch.zeros(scores.shape, dtype=torch.uint8, device=scores.device)
            seen = seen.scatter_reduce(1, input_ids, self._mask(input_ids).to(torch.uint8), "amax").bool()
        return tilt_logprobs(
            scores, self._pooled(input_ids, self.tap.states), self.head, self.temperature, self.strength, seen
        )

    def _mask(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """1 for every real token of ``input_ids``: the prompt's mask, then every generated position."""
        prompt = self.prompt_mask if self.prompt_mask is not None else torch.ones_like(input_ids[:, :0])
        prompt = prompt.to(input_ids.device)
        rest = torch.ones(len(input_ids), input_ids.shape[1] - prompt.shape[1], device=input_ids.device)
        return torch.cat([prompt.to(rest.dtype), rest], 1)
