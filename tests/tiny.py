"""Tiny models and task matrices for tests, built from configs (never downloaded)."""

from __future__ import annotations

import torch
from torch import nn


def tiny_llama(layers: int = 4, hidden: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def block_task_matrices(model: nn.Module, hot: int = 1, seed: int = 0, scale: float = 0.01, hot_gain: float = 4.0):
    """Random task matrices for every 2-D weight in the decoder blocks; block ``hot`` carries more energy."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.dim() == 2 and ".layers." in name:
            gain = hot_gain if f".layers.{hot}." in name else 1.0
            out[name] = scale * gain * torch.randn(p.shape, generator=g)
    return out


class ConvExperts(nn.Module):
    """A Conv1d block and a fused 3-D expert tensor, as in speaker models and MoE LLMs."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Conv1d(6, 8, kernel_size=3) for _ in range(2)])
        self.experts = nn.ModuleList([nn.Module() for _ in range(2)])
        for e in self.experts:
            e.gate_up_proj = nn.Parameter(0.1 * torch.randn(4, 10, 12))
