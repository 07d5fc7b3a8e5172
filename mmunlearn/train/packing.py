"""Packed rows and a shared prompt prefix: the fast forward behind every answer-only loss and score.

A QA batch is right-padded to its longest row, and with a chat template every row begins with the same tokens
(SmolLM2's system prompt and user header: 24 of a TOFU row's ~80). :func:`plan` lays a batch out so that neither
costs compute:

- **shared prefix**: the longest run of tokens that every row starts with (and that holds no scored position) is
  run once, as a batch of one, and its key/value cache is repeated for the packed sequences; gradients flow back
  through the repeat, so a training step sees the same loss and gradients;
- **packing**: the rest of each row becomes a segment, segments are packed first-fit (longest first) into
  sequences no wider than the longest segment, each token keeps its own position id, and a 4D attention mask lets
  a token see the prefix and the earlier tokens of its own segment only (no attention across packed rows).

The result of :func:`packed_answer_logits` equals the plain forward's logits at the scored positions (same order:
row-major over the batch), to float rounding (tests/train/test_packing.py: per-row losses and gradients).
It applies to Hugging Face Llama and Qwen2 causal LMs without sliding windows, with ``sdpa`` or ``eager``
attention, unwrapped (not under a DDP/FSDP or compile wrapper: the prefix costs a second forward call), with
right-padded rows; :func:`plan` returns None otherwise, and the caller runs the plain forward.
:func:`settings` switches either part off (``mmunlearn bench precision`` times each alone).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn

IGNORE = -100
#: model types whose attention takes position ids, a 4D mask and a key/value cache the way this module uses them
MODEL_TYPES = frozenset({"llama", "qwen2"})
#: a common prefix shorter than this is not worth a second forward call
MIN_PREFIX = 4


@dataclass(frozen=True)
class FastPath:
    """Which parts of the fast forward are on (both by default)."""

    pack: bool = True
    prefix: bool = True


_SETTINGS = FastPath()


def current() -> FastPath:
    """The settings in force."""
    return _SETTINGS


@contextmanager
def settings(*, pack: bool | None = None, prefix: bool | None = None) -> Iterator[FastPath]:
    """Within the block, packing and/or the shared prefix are switched as given (None: unchanged)."""
    global _SETTINGS
    before = _SETTINGS
    _SETTINGS = replace(before, **{k: v for k, v in (("pack", pack), ("prefix", prefix)) if v is not None})
    try:
        yield _SETTINGS
    finally:
        _SETTINGS = before


def supported(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped) is a causal LM this module knows how to feed packed rows and a prefix cache."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or hasattr(model, "module") or hasattr(model, "_orig_mod"):
        return False
    cfg = model.config
    if getattr(cfg, "model_type", None) not in MODEL_TYPES or cfg._attn_implementation not in ("sdpa", "eager"):
        return False
    if getattr(cfg, "use_sliding_window", False):
        return False
    return all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or ()))


@dataclass
class Plan:
    """A batch laid out for :func:`packed_answer_logits`."""

    prefix: torch.Tensor  # (1, P) token ids shared by every row (P may be 0)
    input_ids: torch.Tensor  # (S, W) packed segments
    position_ids: torch.Tensor  # (S, W)
    segments: torch.Tensor  # (S, W) segment number of each slot; -1 on padding
    scored: torch.Tensor  # (N,) flat slot index (s * W + w) of each scored position, in the batch's row-major order

    @property
    def real_slots(self) -> int:
        return int((self.segments >= 0).sum())

    def mask(self, dtype: torch.dtype, additive: bool) -> torch.Tensor:
        """(S, 1, W, P + W) mask: a token sees the prefix and the earlier tokens of its own segment; a padding slot
        sees itself only (so no row of the softmax is empty). Boolean (True: attend) or additive (0 / dtype min)."""
        seg = self.segments
        width, p = seg.shape[1], self.prefix.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0) & causal
        pad = seg < 0
        same |= torch.diag_embed(pad)
        keep = torch.cat([(~pad)[:, :, None].expand(-1, -1, p), same], dim=2)[:, None]
        if not additive:
            return keep
        return torch.zeros(keep.shape, dtype=dtype, device=seg.device).masked_fill(~keep, torch.finfo(dtype).min)


def plan(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor
) -> Plan | None:
    """The packed layout of a right-padded batch, or None when the fast path does not apply or gains nothing."""
    opts = current()
    if not (opts.pack or opts.prefix) or input_ids.dim() != 2 or not supported(model):
        return None
    rows, width = input_ids.shape
    ar = torch.arange(width, device=input_ids.device)
    lengths = (
        attention_mask.sum(1) if attention_mask is not None else torch.full((rows,), width, device=input_ids.device)
    )
    if attention_mask is not None and not torch.equal(attention_mask.bool(), ar[None] < lengths[:, None]):
        return None  # not right-padded (left padding, holes): the plain forward handles it
    scored = torch.zeros_like(labels, dtype=torch.bool)
    scored[:, :-1] = labels[:, 1:] != IGNORE
    if bool((scored & (ar[None] >= lengths[:, None])).any()) or int(lengths.min()) < 1:
        return None  # a score read at a padding position (or an empty row): keep the plain forward's answer
    # gradient checkpointing turns the key/value cache off: no prefix then (transformers 5 renamed the flag)
    name = (
        "is_activation_checkpointing"
        if hasattr(type(model), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    share = opts.prefix and rows > 1 and not getattr(model, name, False)
    p = _common_prefix(input_ids, lengths, scored) if share else 0
    lens = [int(n) - p for n in lengths.tolist()]
    bins, cap = (
        _packed(lens, p, _attention_share(model.config)) if opts.pack else ([[r] for r in range(rows)], max(lens))
    )
    if p == 0 and len(bins) == rows and cap == width:
        return None  # nothing saved
    ids = torch.full((len(bins), cap), int(input_ids[0, 0]), dtype=input_ids.dtype, device=input_ids.device)
    pos = torch.full((len(bins), cap), p, dtype=torch.long, device=input_ids.device)
    seg = torch.full((len(bins), cap), -1, dtype=torch.long, device=input_ids.device)
    slot_of = torch.empty(rows, dtype=torch.long)  # flat slot of each row's first token after the prefix
    for s, members in enumerate(bins):
        col = 0
        for r in members:
            n = lens[r]
            ids[s, col : col + n] = input_ids[r, p : p + n]
            pos[s, col : col + n] = torch.arange(p, p + n)
            seg[s, col : col + n] = r
            slot_of[r] = s * cap + col
            col += n
    b, t = scored.nonzero(as_tuple=True)  # row-major, as the plain path returns them
    flat = slot_of.to(b.device)[b] + (t - p)
    return Plan(input_ids[:1, :p], ids, pos, seg, flat)


def _common_prefix(ids: torch.Tensor, lengths: torch.Tensor, scored: torch.Tensor) -> int:
    """Tokens every row starts with, short of each row's last token and of its first scored position."""
    same = (ids == ids[:1]).all(0)
    limit = min(int(lengths.min()) - 1, ids.shape[1])
    first_scored = scored.any(0).nonzero()
    if first_scored.numel():
        limit = min(limit, int(first_scored[0]))
    diff = (~same[:limit]).nonzero()
    p = int(diff[0]) if diff.numel() else limit
    return p if p >= MIN_PREFIX else 0


def _attention_share(cfg) -> float:
    """Cost of one more key position in a token's attention, relative to the token's linear layers (a count of
    multiply-adds, doubled because attention runs further from the matmul peak than the linear layers do)."""
    hidden = cfg.hidden_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    linear = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * cfg.intermediate_size
    return 2 * 2 * heads * head_dim / linear


def _packed(lengths: list[int], prefix: int, share: float) -> tuple[list[list[int]], int]:
    """(bins, width): first-fit packing into the width, among 1-4x the longest row, that minimises
    slots x (1 + share x attended positions): wider bins leave less padding but attend over more positions."""
    best: tuple[float, list[list[int]], int] | None = None
    for k in (1, 2, 3, 4):
        cap = k * max(lengths)
        bins = _first_fit(lengths, cap)
        cost = len(bins) * cap * (1 + share * (prefix + cap))
        if best is None or cost < best[0]:
            best = (cost, bins, cap)
        if len(bins) == 1:
            break
    return best[1], best[2]


def _first_fit(lengths: list[int], cap: int) -> list[list[int]]:
    """Rows packed first-fit, longest first, into bins of ``cap`` tokens (each bin's rows in row order)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for r in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for k, free in enumerate(room):
            if lengths[r] <= free:
                bins[k].append(r)
                room[k] -= lengths[r]
                break
        else:
            bins.append([r])
            room.append(cap - lengths[r])
    return [sorted(b) for b in bins]


def packed_answer_logits(model: nn.Module, head: nn.Module, layout: Plan) -> torch.Tensor:
    """The N x V logits at the scored positions of the batch ``layout`` was made from (row-major order)."""
    pick: list[torch.Tensor | None] = [None]

    def only(_module, args):
        (hidden, *rest) = args
        chosen = hidden[:, :0] if pick[0] is None else hidden.reshape(-1, hidden.shape[-1])[pick[0]].unsqueeze(0)
        return (chosen, *rest)

    cache = None
    p = layout.prefix.shape[1]
    handle = head.register_forward_pre_hook(only)
    try:
        # transformers 5.x renamed past_key_values to cache (the old name warns)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        if p:
            first = model(input_ids=layout.prefix, use_cache=True)  # the prefix once (its logits: none)
            cache = getattr(first, "cache", None) or first.past_key_values
            cache.batch_repeat_interleave(layout.input_ids.shape[0])
        additive = model.config._attn_implementation == "eager"
        dtype = next(model.parameters()).dtype
        pick[0] = layout.scored
        out = model(
            input_ids=layout.input_ids,
            position_ids=layout.position_ids,
            attention_mask=layout.mask(dtype, additive),
            use_cache=cache is not None,
            **{name: cache},
        )
    finally:
        handle.remove()
    return out.logits[0]
