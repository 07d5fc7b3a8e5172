"""Training and evaluation throughput per precision (float32, bf16 autocast, bf16 weights) on one model.

What it measures, all on the same batches in one run (stages alternate between precisions so machine
noise spreads over all of them; the median of ``repeats`` is kept):

- ``train``: tokens/s of one optimiser step (forward, backward, AdamW) on ``batch`` x ``seq`` tokens, float32
  weights, with and without ``torch.autocast(bfloat16)`` -- what ``--precision bf16`` / accelerate's
  ``mixed_precision="bf16"`` does on CPU. Accuracy: the loss of the bf16 step against float32's.
- ``score``: tokens/s of teacher-forced scoring (the forward pass behind every NLL, probability and
  truth-ratio metric), float32, autocast and bf16 weights. Accuracy: the largest per-sequence mean-NLL
  difference against float32.
- ``generate``: new tokens/s of batched greedy decoding with the KV cache (``use_cache=True``, what
  ``TextLLMAdapter.generate`` runs), and float32 without the cache for reference. Accuracy: the share of
  generated tokens equal to float32's.

The model is a real checkpoint folder (``smollm2-135m`` or any save_pretrained folder; weights as
trained) or a random-init preset architecture (``micro``/``mini``; throughput does not depend on
training, agreement does). Inputs are random token ids: throughput does not depend on the text.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

PRECISIONS = ("float32", "bf16-autocast", "bf16-weights")


@dataclass
class PrecisionRow:
    stage: str  # train | score | generate | generate-no-cache
    precision: str
    tokens_per_s: float
    seconds: float  # median time of one repeat
    tokens: int  # tokens processed per repeat (generated tokens for generation)
    speedup: float = 1.0  # against float32 of the same stage
    agreement: str = ""  # accuracy against float32, in words

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PrecisionResult:
    model: str
    parameters: int
    batch: int
    seq: int
    new_tokens: int
    threads: int
    rows: list[PrecisionRow] = field(default_factory=list)
    machine: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [r.to_dict() for r in self.rows]}


def load_model(model: str) -> tuple[torch.nn.Module, str]:
    """(float32 causal LM in eval mode, description) for a preset name, real model name or folder."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from mmunlearn.presets.models import PRESETS, get_preset

    if model in PRESETS:
        arch = PRESETS[model].arch
        cfg = LlamaConfig(vocab_size=4096, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
                          num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                          num_key_value_heads=arch.kv_heads, max_position_embeddings=arch.max_positions,
                          tie_word_embeddings=arch.tie_embeddings, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).eval(), f"{model} (random init)"
    preset = get_preset(model)
    folder = preset.model_dir
    net = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return net, f"{model} ({folder.name})"


def _autocast(on: bool) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _interleaved(stages: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, object]]:
    """Run every stage once per round (after one warm-up each), ``repeats`` rounds; median seconds per stage."""
    results: dict[str, list[float]] = {k: [] for k in stages}
    outputs: dict[str, object] = {}
    for name, fn in stages.items():
        outputs[name] = fn()  # warm-up (first-call allocation and kernel selection)
    for _ in range(repeats):
        for name, fn in stages.items():
            t0 = time.perf_counter()
            outputs[name] = fn()
            results[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), outputs[k]) for k, v in results.items()}


def _seq_nll(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.no_grad(), _autocast(autocast):
        logits = model(input_ids=ids).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -lp.double().mean(1)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, autocast: bool) -> float:
    with _autocast(autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


@contextlib.contextmanager
def _restored(model: torch.nn.Module) -> Iterator[None]:
    """Training steps change the weights: put them back so every repeat and precision starts alike."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        yield
    finally:
        model.load_state_dict(saved)


def run(model: str = "smollm2-135m", *, batch: int = 8, seq: int = 128, new_tokens: int = 32, repeats: int = 3,
        stages: tuple[str, ...] = ("train", "score", "generate"), progress: Callable[[str], None] | None = None
        ) -> PrecisionResult:
    """Median throughput of each stage and precision on the same random batches."""
    say = progress or (lambda _m: None)
    base, name = load_model(model)
    vocab = base.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    result = PrecisionResult(model=name, parameters=sum(p.numel() for p in base.parameters()), batch=batch, seq=seq,
                             new_tokens=new_tokens, threads=torch.get_num_threads(),
                             machine={"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                                      "cores": os.cpu_count()})
    bf16 = copy.deepcopy(base).to(torch.bfloat16).eval()

    if "train" in stages:
        say("train: one AdamW step per repeat, float32 and bf16 autocast")
        net = copy.deepcopy(base).train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-5)
        losses: dict[str, float] = {}

        def step(autocast: bool) -> Callable[[], float]:
            def fn() -> float:
                with _restored(net):
                    # restoring the weights keeps every repeat on the same point; AdamW's state is fresh each time
                    opt.state.clear()
                    return _train_step(net, opt, ids, autocast)
            return fn

        timed = _interleaved({"float32": step(False), "bf16-autocast": step(True)}, repeats)
        losses = {k: float(v[1]) for k, v in timed.items()}
        ref = timed["float32"][0]
        for prec, (sec, _) in timed.items():
            result.rows.append(PrecisionRow("train", prec, batch * seq / sec, sec, batch * seq, ref / sec,
                                            f"loss {losses[prec]:.4f} vs {losses['float32']:.4f}"))
        del net, opt

    if "score" in stages:
        say("score: teacher-forced forward, float32, bf16 autocast, bf16 weights")
        timed = _interleaved({"float32": lambda: _seq_nll(base, ids, False),
                              "bf16-autocast": lambda: _seq_nll(base, ids, True),
                              "bf16-weights": lambda: _seq_nll(bf16, ids, False)}, repeats)
        ref_sec, ref_nll = timed["float32"]
        for prec, (sec, nll) in timed.items():
            diff = float((nll - ref_nll).abs().max())
            result.rows.append(PrecisionRow("score", prec, batch * seq / sec, sec, batch * seq, ref_sec / sec,
                                            f"max NLL diff {diff:.1e} nats"))

    if "generate" in stages:
        say("generate: batched greedy decoding with the KV cache (and float32 without it)")
        prompt = ids[:, : min(seq, 32)]
        kwargs = dict(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                      min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)

        def gen(net: torch.nn.Module, autocast: bool, cache: bool = True) -> Callable[[], torch.Tensor]:
            def fn() -> torch.Tensor:
                with torch.no_grad(), _autocast(autocast):
                    return net.generate(**kwargs, use_cache=cache)[:, prompt.shape[1]:]
            return fn

        timed = _interleaved({"float32": gen(base, False), "bf16-autocast": gen(base, True),
                              "bf16-weights": gen(bf16, False), "float32 no cache": gen(base, False, cache=False)},
                             repeats)
        ref_sec, ref_out = timed["float32"]
        n = batch * new_tokens
        for prec, (sec, out) in timed.items():
            same = float((out == ref_out).float().mean())
            stage = "generate-no-cache" if prec.endswith("no cache") else "generate"
            result.rows.append(PrecisionRow(stage, prec.replace(" no cache", ""), n / sec, sec, n, ref_sec / sec,
                                            f"{100 * same:.1f} % tokens same"))
    return result


def markdown(res: PrecisionResult) -> str:
    lines = ["| stage | precision | tokens/s | speed-up vs float32 | accuracy |", "|---|---|---:|---:|---|"]
    for r in res.rows:
        lines.append(f"| {r.stage} | {r.precision} | {r.tokens_per_s:.1f} | {r.speedup:.2f}x | {r.agreement} |")
    return "\n".join(lines)


def recommend(res: PrecisionResult, min_speedup: float = 1.1) -> dict[str, str]:
    """Per stage, the fastest precision that is at least ``min_speedup`` x float32 (else float32)."""
    best: dict[str, str] = {}
    for stage in ("train", "score", "generate"):
        rows = [r for r in res.rows if r.stage == stage]
        if not rows:
            continue
        fast = max(rows, key=lambda r: r.speedup)
        best[stage] = fast.precision if fast.speedup >= min_speedup and math.isfinite(fast.speedup) else "float32"
    return best
