"""``mmunlearn bench precision``: the project's training, scoring and generation timed beside a plain PyTorch loop.

In float32 and bf16, on real QA batches, with bf16's accuracy against float32. The stages are in
:mod:`mmunlearn.bench.precision_stages`, the result and its rendering in :mod:`mmunlearn.bench.precision_report`
(their names are importable from here too).

Every stage is timed for two implementations on the same batch, in the same run:

- ``plain``: what a user writes with PyTorch + transformers alone. Train: ``model(input_ids,
  attention_mask, labels=labels).loss`` (under ``torch.autocast(bfloat16)`` for bf16), backward, AdamW
  step. Score: full logits, ``log_softmax`` and a gather of the answer tokens. Generate:
  ``model.generate`` (greedy, KV cache) on the float32 model or on a bf16 copy of it.
- ``mmunlearn``: the project's own code. Train: :meth:`TextLLMAdapter.loss` (the answer-only loss of
  :func:`mmunlearn.train.answer_only.answer_logits`, autocast by the adapter's ``precision``), the same
  backward and AdamW step. Score: :meth:`TextLLMAdapter.answer_nll` on the QA items (their collation
  included in the timing). Generate: :meth:`TextLLMAdapter.generate` on the questions (prompt building
  and decoding included), inside :meth:`TextLLMAdapter.bf16_generation` for bf16 (its one bf16 copy is
  made when the block is entered, before the timed rounds; that time is reported apart).

Timing: one warm-up call of every implementation and precision, then ``repeats`` rounds in which each
runs once (the order reversed every other round so drift spreads evenly); the median is kept. Nothing
else happens inside a timed call: no weight copy or restore. Training simply continues from step to
step on the one model (a step costs the same whatever the weights), so after the train stage that
model's weights have changed. Its accuracy column compares losses computed before the timed steps, at
the starting weights.

Tokens counted: train and score, the batch's real (unpadded) tokens; generate, rows x decoding steps
(rows that met EOS still occupy the batch until all have). Both implementations of a stage process the
same tokens, so ``mmunlearn/plain`` is the ratio of their median times.

Inputs are real QA rows (``--data``: a TOFU folder, or the built-in ``synthetic`` data) through the
adapter's ``collate``: chat template when the tokenizer has one, labels on the answer tokens only.
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.adapters.text.tokenizer import train_bpe
from mmunlearn.bench.precision_report import (
    COLUMNS,
    GOAL_RATIO,
    VARIANT_COLUMNS,
    Check,
    PrecisionResult,
    PrecisionRow,
    Variant,
    facts_line,
    goal_lines,
    markdown,
    roofline_line,
    table_rows,
    variant_rows,
)
from mmunlearn.bench.precision_roofline import generate_flops, matmul_roofline, stage_flops
from mmunlearn.bench.precision_stages import (
    ABLATION,
    GENERATE_SAME_GOAL,
    IMPLEMENTATIONS,
    PRECISIONS,
    SCORE_NLL_BOUND,
    STAGES,
    TRAIN_LR,
    Timed,
    _generate_stage,
    _score_stage,
    _train_stage,
    interleaved,
)
from mmunlearn.data.tofu import load_split
from mmunlearn.presets.models import PRESETS, get_preset

__all__ = [
    "ABLATION",
    "COLUMNS",
    "GENERATE_SAME_GOAL",
    "GOAL_RATIO",
    "IMPLEMENTATIONS",
    "PRECISIONS",
    "SCORE_NLL_BOUND",
    "STAGES",
    "TRAIN_LR",
    "VARIANT_COLUMNS",
    "Check",
    "PrecisionResult",
    "PrecisionRow",
    "Timed",
    "Variant",
    "facts_line",
    "goal_lines",
    "interleaved",
    "load_model",
    "machine_facts",
    "markdown",
    "roofline_line",
    "run",
    "table_rows",
    "variant_rows",
]


# ---------------------------------------------------------------------------------------------- inputs
def machine_facts() -> dict[str, Any]:
    """Cores, CPU model, library versions, bf16 support flags of the CPU and the 1-minute load average."""
    import transformers

    flags: set[str] = set()
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "avx512_bf16": "avx512_bf16" in flags if flags else None,
        "amx_bf16": "amx_bf16" in flags if flags else None,
        "load_1min_before": _load(),
    }


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def load_model(model: str, data: str) -> tuple[nn.Module, Any, str, int]:
    """(float32 causal LM in eval mode, its tokenizer, description, max tokens per QA row) for a preset name
    (``micro``/``mini``: random init, with a BPE trained on ``data``'s texts), a real model name
    (``smollm2-135m``) or a model folder."""
    if model in PRESETS:
        preset = PRESETS[model]
        texts = [f"{i.question} {i.answer}" for i in load_split(data, "full")[:400]]
        tokenizer = train_bpe(texts, vocab_size=preset.arch.vocab_size)
        return preset.arch.build(tokenizer), tokenizer, f"{model} (random init)", preset.max_length
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = get_preset(model).model_dir
    net = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return net, AutoTokenizer.from_pretrained(str(folder)), f"{model} ({folder.name})", 512


# ---------------------------------------------------------------------------------------------- run
def run(
    model: str | tuple[nn.Module, Any] = "smollm2-135m",
    *,
    data: str = "synthetic",
    split: str = "forget10",
    batch: int = 16,
    new_tokens: int = 32,
    repeats: int = 3,
    stages: Sequence[str] = STAGES,
    precisions: Sequence[str] = PRECISIONS,
    max_length: int | None = None,
    ablation: bool = False,
    progress: Callable[[str], None] | None = None,
) -> PrecisionResult:
    """Time every stage and precision for both implementations on the first ``batch`` QA rows of ``split``.

    ``model`` is a name (:func:`load_model`) or a ``(float32 causal LM, tokenizer)`` pair; the train stage
    trains that model in place (scoring and generation use a copy of it taken before). ``ablation`` also times,
    in the same rounds, each speed-up of the project's training and scoring alone (:data:`ABLATION`). A large
    matmul at each precision is timed before and after the stages: each row's share of it is its model FLOPs
    per second over the better of the two (:mod:`mmunlearn.bench.precision_roofline`)."""
    _check_args(stages, precisions, batch, new_tokens, repeats)
    say = progress or (lambda _m: None)
    machine = machine_facts()
    if isinstance(model, str):
        say(f"loading {model}")
        net, tokenizer, name, limit = load_model(model, data)
    else:
        (net, tokenizer), name, limit = model, type(model[0]).__name__, 512
    limit = max_length or limit
    items = load_split(data, split)[:batch]
    if not items:
        raise ValueError(f"split {split!r} of {data!r} has no rows")
    adapter = TextLLMAdapter(net, tokenizer, max_length=limit)
    qa = adapter.collate(items)
    result = PrecisionResult(
        model=name,
        parameters=sum(p.numel() for p in net.parameters()),
        data=str(data),
        split=split,
        batch=len(items),
        batch_tokens=int(qa["attention_mask"].sum()),
        answer_tokens=int((qa["labels"][:, 1:] != -100).sum()),
        new_tokens=new_tokens,
        repeats=repeats,
        threads=torch.get_num_threads(),
        machine=machine,
    )
    ref = copy.deepcopy(net).eval()  # scoring and generation: the starting weights, whatever training does
    say("roofline: a large matmul at each precision")
    result.roofline += [matmul_roofline(p).to_dict() for p in precisions]
    if "train" in stages:
        say(f"train: forward + backward + AdamW step on {len(items)} QA, {', '.join(precisions)}, plain and mmunlearn")
        rows, checks, variants = _train_stage(net, tokenizer, qa, precisions, repeats, limit, ablation)
        result.rows += rows
        result.checks += checks
        result.variants += variants
        result.weights_changed = any(not torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))
    if "score" in stages:
        say("score: teacher-forced answer NLL, plain (full logits) and mmunlearn (answer_nll)")
        rows, checks, variants = _score_stage(ref, tokenizer, items, qa, precisions, repeats, limit, ablation)
        result.rows += rows
        result.checks += checks
        result.variants += variants
    if "generate" in stages:
        say(f"generate: greedy decoding with the KV cache, up to {new_tokens} new tokens")
        rows, checks, result.bf16_copy_seconds = _generate_stage(
            ref, tokenizer, [i.question for i in items], precisions, repeats, new_tokens, limit
        )
        result.rows += rows
        result.checks += checks
    result.checks += [
        Check(
            f"{r.stage} {r.precision}: mmunlearn tokens/s >= {GOAL_RATIO}x the plain loop's",
            r.goal_met,
            f"{r.ratio:.2f}x",
            "goal",
        )
        for r in result.rows
    ]
    result.roofline += [matmul_roofline(p).to_dict() for p in precisions]
    _shares(result, getattr(net, "config", None), qa, adapter.prompt_batch([i.question for i in items]))
    result.machine["load_1min_after"] = _load()
    return result


def _check_args(stages: Sequence[str], precisions: Sequence[str], batch: int, new_tokens: int, repeats: int) -> None:
    bad = [s for s in stages if s not in STAGES] + [p for p in precisions if p not in PRECISIONS]
    if bad or not stages or not precisions:
        raise ValueError(f"stages must come from {STAGES} and precisions from {PRECISIONS}; got {bad or 'none'}")
    if list(precisions) != [p for p in PRECISIONS if p in precisions]:
        raise ValueError(f"precisions must be listed float32 first, without repeats: got {list(precisions)}")
    if batch < 1 or new_tokens < 1 or repeats < 1:
        raise ValueError(f"batch, new_tokens and repeats must be >= 1, got {batch}, {new_tokens}, {repeats}")


def _shares(
    result: PrecisionResult, config: Any, qa: dict[str, torch.Tensor], prompts: dict[str, torch.Tensor]
) -> None:
    """Each row's model FLOPs per call and its share of the better matmul measurement at its precision."""
    lengths = [int(n) for n in qa["attention_mask"].sum(1)]
    prompt_lengths = [int(n) for n in prompts["attention_mask"].sum(1)]
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    for m in result.roofline:
        best[m["precision"]] = max(best.get(m["precision"], 0.0), m["flops_per_s"])
        best_cpu[m["precision"]] = max(best_cpu.get(m["precision"], 0.0), m["cpu_flops_per_s"])
    for r in result.rows:
        r.flops = (
            generate_flops(config, prompt_lengths, int(r.accuracy.get("decoding_steps", 0)))
            if r.stage == "generate"
            else stage_flops(r.stage, config, lengths, result.answer_tokens)
        )
        if r.flops is not None and best.get(r.precision):
            r.plain_roofline_share = r.flops / r.plain_seconds / best[r.precision]
            r.mmunlearn_roofline_share = r.flops / r.mmunlearn_seconds / best[r.precision]
        if r.flops is not None and best_cpu.get(r.precision) and r.plain_cpu_runs and r.mmunlearn_cpu_runs:
            r.plain_cpu_roofline_share = r.flops / statistics.median(r.plain_cpu_runs) / best_cpu[r.precision]
            r.mmunlearn_cpu_roofline_share = r.flops / statistics.median(r.mmunlearn_cpu_runs) / best_cpu[r.precision]
