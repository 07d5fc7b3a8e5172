"""Answer-only logits: a causal LM's output projection applied only where a target token is scored.

A QA batch scores its answer tokens only (labels ``-100`` on the prompt and padding), yet a plain
forward projects every position onto the whole vocabulary (49,152 entries for SmolLM2), the largest
single cost of a small model's step. :func:`answer_logits` runs the same forward (through the module it
is given, so accelerate's autocast wrapper and distributed wrappers still apply) with a pre-hook on the
output projection that keeps only the hidden states of scored positions; the logits it returns are those
the full forward would give at those positions (same weights, same inputs; tested).

Only plain Hugging Face causal LMs (``transformers.PreTrainedModel`` with an output projection) take
this path; anything else (e.g. T3's tilted wrapper, whose forward mixes in a head) is asked for its
full logits, which are then indexed the same way. For the Llama and Qwen2 models the forward itself is also
laid out to skip padding and the rows' shared prompt prefix (:mod:`mmunlearn.train.packing`: rows packed without
attention across them, the common prefix run once); the logits are the same.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
...                                      num_hidden_layers=1, num_attention_heads=2)).eval()
>>> ids = torch.randint(0, 32, (2, 6))
>>> labels = torch.tensor([[-100, -100, 3, 4, 5, -100], [-100, 7, 8, -100, -100, -100]])
>>> logits, targets, rows = answer_logits(model, ids, torch.ones_like(ids), labels)
>>> logits.shape, targets.tolist(), rows.tolist()   # 5 scored tokens: 3 in row 0, 2 in row 1
(torch.Size([5, 32]), [3, 4, 5, 7, 8], [0, 0, 0, 1, 1])
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from mmunlearn.train import packing

IGNORE = -100


def _inner(model: nn.Module) -> nn.Module:
    """The module under distributed / compile wrappers (``.module``, ``._orig_mod``)."""
    while True:
        nxt = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(nxt, nn.Module):
            return model
        model = nxt


def supports_answer_only(model: nn.Module) -> bool:
    """Whether ``model`` is a plain HF causal LM whose output projection can be restricted."""
    from transformers import PreTrainedModel

    inner = _inner(model)
    return isinstance(inner, PreTrainedModel) and isinstance(inner.get_output_embeddings(), nn.Module)


def autocast_context(device: torch.device | str, dtype: torch.dtype | None):
    """``torch.autocast`` for ``dtype`` on ``device`` (a no-op context when ``dtype`` is None)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def answer_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token logits at the scored positions only: ``(N x V logits, N targets, N row indices)``.

    Position ``t`` of row ``b`` is scored when ``labels[b, t + 1] != -100`` (its logits predict that
    label); rows and positions come out in row-major order. Logits are returned in the dtype the model
    produced (bf16 under autocast); callers cast before a softmax.
    """
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} differ in shape")
    scored = labels[:, 1:] != IGNORE  # B x T-1
    targets = labels[:, 1:][scored]
    rows = scored.nonzero(as_tuple=True)[0]
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = scored
    if supports_answer_only(model):
        head = _inner(model).get_output_embeddings()
        layout = packing.plan(model, input_ids, attention_mask, labels)
        if layout is not None:
            return packing.packed_answer_logits(model, head, layout), targets, rows

        def only_scored(_module, args):
            (hidden, *rest) = args
            return (hidden[keep].unsqueeze(0), *rest)

        handle = head.register_forward_pre_hook(only_scored)
        try:
            out = model(input_ids=input_ids, attention_mask=attention_mask)
        finally:
            handle.remove()
        return out.logits[0], targets, rows
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    return out.logits[:, :-1][scored], targets, rows
