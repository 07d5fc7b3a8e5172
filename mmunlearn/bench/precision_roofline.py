"""The core's own limit for ``mmunlearn bench precision``: a large matmul's FLOP/s, and a stage's model FLOPs.

:func:`matmul_roofline` times a square matrix product in the benchmark's thread (float32 at n = 2048; bf16 grown
from n = 256 until one product takes a tenth of a second, so that an emulated bf16 still finishes). A stage's
achieved FLOP/s is its *model FLOPs* (:func:`stage_flops`: what the real, unpadded tokens need, each row computed
on its own) over its median time; its share of the roofline is that over the matmul's FLOP/s at the same precision.
Model FLOPs count the multiply-adds of the decoder's linear layers for every real token (2 per weight), causal
attention over each token's own earlier tokens (4 x heads x head dimension per layer per key), the LM head at the
scored (training, scoring) or generated positions, and three times the forward for a training step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

#: float32 roofline matrix size (n x n times n x n)
FLOAT32_N = 2048
#: bf16 grows from this size until one product takes at least MIN_SECONDS (or reaches FLOAT32_N)
BF16_START_N = 256
MIN_SECONDS = 0.1


@dataclass
class Roofline:
    """One matmul measurement: size, median wall and thread-CPU seconds of ``repeats`` products, FLOP/s of each."""

    precision: str
    n: int
    seconds: float
    cpu_seconds: float
    flops_per_s: float
    cpu_flops_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def matmul_roofline(precision: str, repeats: int = 3) -> Roofline:
    """FLOP/s of an n x n matmul at ``precision`` (float32 or bf16) in this thread (median of ``repeats``)."""
    dtype = {"float32": torch.float32, "bf16": torch.bfloat16}[precision]
    n = FLOAT32_N if precision == "float32" else BF16_START_N
    while True:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        t0 = time.perf_counter()
        a @ b  # warm-up and size probe
        probe = time.perf_counter() - t0
        if precision == "float32" or probe >= MIN_SECONDS or n >= FLOAT32_N:
            break
        n *= 2
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        a @ b
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    flops = 2.0 * n**3
    return Roofline(precision, n, wall, cpu, flops / wall, flops / max(cpu, 1e-9))


def _shape(config: Any) -> tuple[int, int, int, int] | None:
    """(layers, linear weights per layer, attention width heads x head_dim, hidden x vocab) or None."""
    try:
        hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
        inter, vocab = config.intermediate_size, config.vocab_size
    except AttributeError:
        return None
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * inter
    return layers, per_layer, heads * head_dim, hidden * vocab


def forward_flops(config: Any, lengths: list[int], head_positions: int) -> float | None:
    """Model FLOPs of one forward over rows of ``lengths`` real tokens with the LM head at ``head_positions``."""
    shape = _shape(config)
    if shape is None:
        return None
    layers, per_layer, width, head = shape
    tokens = sum(lengths)
    keys = sum(n * (n + 1) // 2 for n in lengths)  # causal: token t attends to t + 1 keys
    return 2.0 * layers * per_layer * tokens + 4.0 * layers * width * keys + 2.0 * head * head_positions


def generate_flops(config: Any, prompt_lengths: list[int], steps: int) -> float | None:
    """Model FLOPs of greedy decoding ``steps`` tokens after each prompt (the prompt's forward included)."""
    shape = _shape(config)
    if shape is None:
        return None
    layers, per_layer, width, head = shape
    prompt = forward_flops(config, prompt_lengths, len(prompt_lengths))
    new = len(prompt_lengths) * steps
    keys = sum(steps * n + steps * (steps + 1) // 2 for n in prompt_lengths)
    return prompt + 2.0 * layers * per_layer * new + 4.0 * layers * width * keys + 2.0 * head * new


def stage_flops(stage: str, config: Any, lengths: list[int], answer_positions: int) -> float | None:
    """Model FLOPs of one call of a training or scoring stage (training: forward x 3)."""
    fwd = forward_flops(config, lengths, answer_positions)
    if fwd is None:
        return None
    return 3.0 * fwd if stage == "train" else fwd
