"""Tiny models and task matrices for tests, built from configs (never downloaded)."""

from __future__ import annotations

import torch
from torch import nn


def tiny_llama(layers: int = 4, hidden: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
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


_TOKENIZER = None


def tiny_tokenizer():
    """A byte-level BPE (vocab 512) trained on a slice of the synthetic TOFU data; cached per session."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from mmunlearn.adapters.text.tokenizer import train_bpe
        from mmunlearn.data.tofu import load_split

        items = load_split("synthetic", "full")[:200]
        _TOKENIZER = train_bpe([f"{i.question} {i.answer}" for i in items], vocab_size=512)
    return _TOKENIZER


def tiny_causal_lm(arch: str = "llama", vocab: int = 512, hidden: int = 32, layers: int = 2, seed: int = 0):
    """A random-init causal LM of a given architecture, sized for tests."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        return tf.LlamaForCausalLM(cfg).eval()
    if arch == "qwen2":
        cfg = tf.Qwen2Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        return tf.Qwen2ForCausalLM(cfg).eval()
    if arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
        return tf.GPT2LMHeadModel(cfg).eval()
    raise ValueError(arch)


#: Settings that make every method fast on tiny models; ``fast(method)`` keeps those its config has.
FAST_OPTIONS = {
    "rank": 2,
    "retain_rank": 4,
    "extract_kind": "gradient",
    "extract_lr": 1.0,
    "epochs": 1,
    "lr": 1e-3,
    "batch_size": 8,
    "head_rank": 4,
    "head_epochs": 30,
    "head_lr": 5e-2,
    "temperature": 1.0,
    "steps": 4,
}


def fast(method: str, **more) -> dict:
    """``FAST_OPTIONS`` (and ``more``) restricted to the settings of ``method``'s config."""
    from mmunlearn.config import applicable_overrides
    from mmunlearn.methods import get

    return applicable_overrides(get(method).config, {**FAST_OPTIONS, **more})
