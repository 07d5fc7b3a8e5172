"""T3 generation throughput: tilted vs plain greedy decoding, same prompts, same run.

Both decode exactly ``new_tokens`` tokens per prompt (EOS disabled) so the work is identical;
runs alternate plain/tilted to spread machine noise, and the median tokens/s of each is kept.
The model is a randomly initialised preset architecture (throughput does not depend on training).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from mmunlearn.presets.models import get_preset


@dataclass
class TiltBenchRow:
    batch: int
    new_tokens: int
    plain_tokens_per_s: float
    tilted_tokens_per_s: float
    overhead: float  # extra time per generated token, as a fraction of plain decoding
    head_parameters: int
    model_parameters: int

    def to_dict(self) -> dict:
        return asdict(self)


def _model(preset: str, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    arch = get_preset(preset).arch
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=arch.tie_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def run(
    preset: str = "mini",
    batch: int = 16,
    prompt_tokens: int = 24,
    new_tokens: int = 64,
    repeats: int = 5,
    rank: int = 20,
    temperature: float = 1.5,
) -> TiltBenchRow:
    """Median tokens/s of plain and tilted greedy generation on the same prompts."""
    from mmunlearn.tilt import TiltedCausalLM, TiltHead  # deferred: tilt imports transformers, kept out of CLI start

    base = _model(preset, 4096)
    head = TiltHead(base.config.hidden_size, base.config.vocab_size, rank)
    torch.nn.init.normal_(head.B.weight, std=0.1)
    tilted = TiltedCausalLM(base, head, temperature)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, base.config.vocab_size, (batch, prompt_tokens), generator=g)
    kwargs = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    plain, tilt = [], []
    with torch.no_grad():
        base.generate(**kwargs)  # warm-up
        tilted.generate(**kwargs)
        for _ in range(repeats):
            for model, times in ((base, plain), (tilted, tilt)):
                t0 = time.perf_counter()
                out = model.generate(**kwargs)
                times.append(time.perf_counter() - t0)
                if out.shape[1] != prompt_tokens + new_tokens:
                    raise RuntimeError("generation stopped early: the comparison would be unfair")
    tokens = batch * new_tokens
    p, t = statistics.median(plain), statistics.median(tilt)
    return TiltBenchRow(
        batch,
        new_tokens,
        tokens / p,
        tokens / t,
        t / p - 1.0,
        sum(x.numel() for x in head.parameters()),
        sum(x.numel() for x in base.parameters()),
    )
