"""The timed stages of ``mmunlearn bench precision`` (train, score, generate): the plain loop beside the adapter."""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.bench.precision_report import Check, PrecisionRow, Variant
from mmunlearn.train import packing
from mmunlearn.train.config import TrainConfig
from mmunlearn.train.schedule import make_optimizer

STAGES = ("train", "score", "generate")
PRECISIONS = ("float32", "bf16")
IMPLEMENTATIONS = ("plain", "mmunlearn")
#: bf16 scoring: the mean per-item answer NLL difference against float32 may not exceed this (nats)
SCORE_NLL_BOUND = 0.02
#: bf16 greedy answers identical to float32's on a memorised model (not expected of a random or pretrained one)
GENERATE_SAME_GOAL = 0.9
#: learning rate of the timed AdamW steps (the cost of a step does not depend on it)
TRAIN_LR = 1e-5
#: the ablation: each of the project's speed-ups alone on top of its code before them ("before": rows right-padded,
#: every row's prompt computed, torch's default AdamW); the settings of mmunlearn.train.packing, fused AdamW or not
ABLATION = {
    "before": (False, False, False),
    "+packing": (True, False, False),
    "+prefix": (False, True, False),
    "+fused AdamW": (False, False, True),
}


def _autocast(bf16: bool) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _adapter_precision(precision: str) -> str:
    return "bf16" if precision == "bf16" else "no"


# ---------------------------------------------------------------------------------------------- timing
Timed = dict[tuple[str, str], Callable[[], Any]]


def interleaved(
    calls: Timed, repeats: int, cpu: dict[tuple[str, str], list[float]] | None = None
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], Any]]:
    """Seconds of ``repeats`` calls of each entry after one warm-up call each, and each entry's last output.

    Each round calls every entry once; the order is reversed every other round. ``cpu``, when given, receives
    each call's thread CPU seconds (what the call itself computed, whatever else the machine ran meanwhile)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    outputs = {key: fn() for key, fn in calls.items()}  # warm-up: first-call allocation, kernel choice
    runs: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for r in range(repeats):
        for key in keys if r % 2 == 0 else keys[::-1]:
            t0, c0 = time.perf_counter(), time.thread_time()
            outputs[key] = calls[key]()
            runs[key].append(time.perf_counter() - t0)
            if cpu is not None:
                cpu.setdefault(key, []).append(time.thread_time() - c0)
    return runs, outputs


def _rows(
    stage: str,
    runs: dict[tuple[str, str], list[float]],
    tokens: dict[str, int],
    accuracy: dict[str, dict[str, Any]],
    words: dict[str, str],
    cpu: dict[tuple[str, str], list[float]] | None = None,
) -> list[PrecisionRow]:
    rows = []
    cpu = cpu or {}
    for prec in PRECISIONS:
        if ("plain", prec) not in runs:
            continue
        p_sec, m_sec = statistics.median(runs["plain", prec]), statistics.median(runs["mmunlearn", prec])
        p_tps, m_tps = tokens[prec] / p_sec, tokens[prec] / m_sec
        rows.append(
            PrecisionRow(
                stage,
                prec,
                tokens[prec],
                runs["plain", prec],
                runs["mmunlearn", prec],
                p_sec,
                m_sec,
                p_tps,
                m_tps,
                m_tps / p_tps,
                accuracy=accuracy.get(prec, {}),
                agreement=words.get(prec, ""),
                plain_cpu_runs=cpu.get(("plain", prec), []),
                mmunlearn_cpu_runs=cpu.get(("mmunlearn", prec), []),
            )
        )
    ref = rows[0]
    for r in rows:
        r.plain_speedup = r.plain_tokens_per_s / ref.plain_tokens_per_s
        r.mmunlearn_speedup = r.mmunlearn_tokens_per_s / ref.mmunlearn_tokens_per_s
    return rows


def _variants(
    stage: str, runs: dict[tuple[str, str], list[float]], cpu: dict[tuple[str, str], list[float]], tokens: int
) -> list[Variant]:
    """The ablation rows of a stage: every timed entry but plain's, against "before" and plain (same rounds)."""
    out = []
    for (impl, prec), walls in runs.items():
        if impl == "plain" or ("before", prec) not in runs:
            continue
        out.append(
            Variant(
                stage,
                prec,
                impl,
                tokens,
                walls,
                cpu[impl, prec],
                runs["before", prec],
                cpu["before", prec],
                runs["plain", prec],
                cpu["plain", prec],
            )
        )
    return out


def _with(settings: tuple[bool, ...], fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with packing and the shared prefix switched as ``settings`` (pack, prefix, ...) say."""

    def call() -> Any:
        with packing.settings(pack=settings[0], prefix=settings[1]):
            return fn()

    return call


# ---------------------------------------------------------------------------------------------- stages
def _train_stage(
    net: nn.Module,
    tokenizer,
    batch: dict[str, torch.Tensor],
    precisions: Sequence[str],
    repeats: int,
    max_length: int,
    ablation: bool = False,
) -> tuple[list[PrecisionRow], list[Check], list[Variant]]:
    """AdamW steps on ``net`` itself (it keeps training: no copy, no restore). The plain loop steps torch's
    default AdamW, the project's code the training loop's optimizer
    (:func:`mmunlearn.train.schedule.make_optimizer`)."""
    net.train()
    adapters = {
        p: TextLLMAdapter(net, tokenizer, max_length=max_length, precision=_adapter_precision(p)) for p in precisions
    }
    opt = torch.optim.AdamW(net.parameters(), lr=TRAIN_LR)
    ours = make_optimizer(list(net.parameters()), TrainConfig(epochs=1, lr=TRAIN_LR, weight_decay=0.0))

    def plain_loss(prec: str) -> torch.Tensor:
        with _autocast(prec == "bf16"):
            return net(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
            ).loss

    def step(loss: torch.Tensor, optimizer: torch.optim.Optimizer = opt) -> float:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    calls: Timed = {}
    for p in precisions:
        calls["plain", p] = lambda p=p: step(plain_loss(p))
        calls["mmunlearn", p] = lambda p=p: step(adapters[p].loss(batch), ours)
        for name, flags in ABLATION.items() if ablation else ():
            calls[name, p] = _with(flags, lambda p=p, f=flags[2]: step(adapters[p].loss(batch), ours if f else opt))
    with torch.no_grad():  # accuracy at the starting weights, before any step
        start = {
            (impl, p): float(
                plain_loss(p)
                if impl == "plain"
                else _with(ABLATION.get(impl, (True, True)), lambda p=p: adapters[p].loss(batch))()
            )
            for impl, p in calls
        }
    cpu: dict[tuple[str, str], list[float]] = {}
    runs, _ = interleaved(calls, repeats, cpu)
    net.eval()
    ref = start["mmunlearn", precisions[0]]
    accuracy, words, checks = {}, {}, []
    for p in precisions:
        mm, plain = start["mmunlearn", p], start["plain", p]
        accuracy[p] = {"loss": mm, "plain_loss": plain, "loss_minus_float32": mm - ref}
        words[p] = (
            f"loss {mm:.4f} ({mm - ref:+.4f} vs float32); plain {plain:.4f}"
            if p != precisions[0]
            else f"loss {mm:.4f}; plain {plain:.4f}"
        )
        checks.append(
            Check(
                f"train {p}: the answer-only loss equals the plain loop's (|diff| <= 1e-3 x loss)",
                abs(mm - plain) <= 1e-3 * max(1.0, abs(plain)),
                f"{mm:.5f} vs {plain:.5f}",
                "same",
            )
        )
        if ablation:
            worst = max(abs(start[k] - plain) for k in start if k[1] == p and k[0] in ABLATION)
            checks.append(
                Check(
                    f"train {p}: every ablation step's loss equals the plain loop's (|diff| <= 1e-3 x loss)",
                    worst <= 1e-3 * max(1.0, abs(plain)),
                    f"max |diff| {worst:.2e}",
                    "same",
                )
            )
    tokens = int(batch["attention_mask"].sum())
    rows = _rows("train", runs, {p: tokens for p in precisions}, accuracy, words, cpu)
    return rows, checks, _variants("train", runs, cpu, tokens)


def _score_stage(
    ref: nn.Module,
    tokenizer,
    items: Sequence[Any],
    batch: dict[str, torch.Tensor],
    precisions: Sequence[str],
    repeats: int,
    max_length: int,
    ablation: bool = False,
) -> tuple[list[PrecisionRow], list[Check], list[Variant]]:
    adapters = {
        p: TextLLMAdapter(ref, tokenizer, max_length=max_length, precision=_adapter_precision(p)) for p in precisions
    }
    targets = batch["labels"][:, 1:]
    scored = targets != -100

    @torch.no_grad()
    def plain_nll(prec: str) -> torch.Tensor:
        with _autocast(prec == "bf16"):
            logits = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
        return -(logp * scored).sum(1) / scored.sum(1).clamp(min=1)

    calls: Timed = {}
    for p in precisions:
        calls["plain", p] = lambda p=p: plain_nll(p)
        calls["mmunlearn", p] = lambda p=p: adapters[p].answer_nll(items, batch_size=len(items))
        for name, flags in ABLATION.items() if ablation else ():
            if not flags[2]:  # the optimiser plays no part in scoring
                calls[name, p] = _with(flags, lambda p=p: adapters[p].answer_nll(items, batch_size=len(items)))
    cpu: dict[tuple[str, str], list[float]] = {}
    runs, out = interleaved(calls, repeats, cpu)
    nll = {key: v.double() for key, v in out.items()}
    base = nll["mmunlearn", precisions[0]]
    accuracy, words, checks = {}, {}, []
    for p in precisions:
        mm = nll["mmunlearn", p]
        gap = float((mm - base).abs().mean())
        accuracy[p] = {
            "mean_nll": float(mm.mean()),
            "mean_abs_nll_diff_vs_float32": gap,
            "max_abs_nll_diff_vs_float32": float((mm - base).abs().max()),
            "mean_nll_diff_vs_float32": float(mm.mean() - base.mean()),
            "max_abs_nll_diff_vs_plain": float((mm - nll["plain", p]).abs().max()),
        }
        words[p] = (
            f"mean NLL {float(mm.mean()):.4f}; vs float32 mean abs diff {gap:.4f} nats"
            f" (max {accuracy[p]['max_abs_nll_diff_vs_float32']:.4f})"
        )
        if p == "bf16":
            checks.append(
                Check(
                    f"score bf16: mean |answer NLL - float32's| <= {SCORE_NLL_BOUND} nats",
                    gap <= SCORE_NLL_BOUND,
                    f"{gap:.4f} nats",
                )
            )
        checks.append(
            Check(
                f"score {p}: answer_nll equals the plain loop's NLL (max |diff| <= 0.02 nats)",
                accuracy[p]["max_abs_nll_diff_vs_plain"] <= 0.02,
                f"max |diff| {accuracy[p]['max_abs_nll_diff_vs_plain']:.2e} nats",
                "same",
            )
        )
        if ablation:
            worst = max(float((nll[k] - nll["plain", p]).abs().max()) for k in nll if k[1] == p and k[0] in ABLATION)
            checks.append(
                Check(
                    f"score {p}: every ablation's NLL equals the plain loop's (max |diff| <= 0.02 nats)",
                    worst <= 0.02,
                    f"max |diff| {worst:.2e} nats",
                    "same",
                )
            )
    tokens = int(batch["attention_mask"].sum())
    rows = _rows("score", runs, {p: tokens for p in precisions}, accuracy, words, cpu)
    return rows, checks, _variants("score", runs, cpu, tokens)


def _generate_stage(
    ref: nn.Module,
    tokenizer,
    questions: list[str],
    precisions: Sequence[str],
    repeats: int,
    new_tokens: int,
    max_length: int,
) -> tuple[list[PrecisionRow], list[Check], float | None]:
    adapters = {
        p: TextLLMAdapter(ref, tokenizer, max_length=max_length, precision=_adapter_precision(p)) for p in precisions
    }
    first = adapters[precisions[0]]
    prompts = first.prompt_batch(questions)
    width = prompts["input_ids"].shape[1]
    models = {p: (copy.deepcopy(ref).to(torch.bfloat16).eval() if p == "bf16" else ref) for p in precisions}

    @torch.no_grad()
    def plain_generate(prec: str) -> torch.Tensor:
        out = models[prec].generate(
            **prompts, max_new_tokens=new_tokens, do_sample=False, pad_token_id=first.pad_id, eos_token_id=first.eos_id
        )
        return out[:, width:]

    calls: Timed = {}
    for p in precisions:
        calls["plain", p] = lambda p=p: plain_generate(p)
        calls["mmunlearn", p] = lambda p=p: adapters[p].generate(
            questions, max_new_tokens=new_tokens, batch_size=len(questions)
        )
    copy_seconds = None
    with contextlib.ExitStack() as stack:
        if "bf16" in adapters:
            t0 = time.perf_counter()
            stack.enter_context(adapters["bf16"].bf16_generation())  # its bf16 copy, made once
            copy_seconds = time.perf_counter() - t0
        cpu: dict[tuple[str, str], list[float]] = {}
        runs, out = interleaved(calls, repeats, cpu)
    texts = {
        p: [t.strip() for t in tokenizer.batch_decode(out["plain", p], skip_special_tokens=True)] for p in precisions
    }
    base = out["mmunlearn", precisions[0]]
    accuracy, words, checks, tokens = {}, {}, [], {}
    for p in precisions:
        answers = out["mmunlearn", p]
        same = sum(a == b for a, b in zip(answers, base))
        as_plain = sum(a == b for a, b in zip(answers, texts[p]))
        tokens[p] = len(questions) * int(out["plain", p].shape[1])
        accuracy[p] = {
            "same_as_float32": same,
            "answers": len(answers),
            "share_same_as_float32": same / len(answers),
            "same_as_plain": as_plain,
            "decoding_steps": int(out["plain", p].shape[1]),
        }
        words[p] = f"{same}/{len(answers)} answers identical to float32 ({100 * same / len(answers):.0f} %)"
        if p == "bf16":
            checks.append(
                Check(
                    f"generate bf16: >= {100 * GENERATE_SAME_GOAL:.0f} % of greedy answers identical "
                    "to float32 (the bound applies to a memorised model)",
                    same >= GENERATE_SAME_GOAL * len(answers),
                    f"{same}/{len(answers)}",
                    "memorised",
                )
            )
        checks.append(
            Check(
                f"generate {p}: the adapter's answers equal the plain loop's",
                as_plain == len(answers),
                f"{as_plain}/{len(answers)}",
                "same",
            )
        )
    return _rows("generate", runs, tokens, accuracy, words, cpu), checks, copy_seconds
