"""``mmunlearn bench precision``: the project's training, scoring and generation beside a plain PyTorch loop,
in float32 and bf16, on real QA batches, with bf16's accuracy against float32.

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
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from mmunlearn.adapters.text_llm import TextLLMAdapter
from mmunlearn.adapters.tokenizer import train_bpe
from mmunlearn.data.tofu import load_split
from mmunlearn.presets.models import PRESETS, get_preset

STAGES = ("train", "score", "generate")
PRECISIONS = ("float32", "bf16")
IMPLEMENTATIONS = ("plain", "mmunlearn")
#: the project's tokens/s must reach this share of the plain loop's (issue 22)
GOAL_RATIO = 0.9
#: bf16 scoring: the mean per-item answer NLL difference against float32 may not exceed this (nats)
SCORE_NLL_BOUND = 0.02
#: bf16 greedy answers identical to float32's on a memorised model (not expected of a random or pretrained one)
GENERATE_SAME_GOAL = 0.9
#: learning rate of the timed AdamW steps (the cost of a step does not depend on it)
TRAIN_LR = 1e-5


@dataclass
class PrecisionRow:
    """One stage at one precision: both implementations' timings on the same tokens and the accuracy."""

    stage: str
    precision: str
    tokens: int  # tokens one call processes (see the module docstring)
    plain_runs: list[float]  # seconds of each timed call, warm-up excluded
    mmunlearn_runs: list[float]
    plain_seconds: float  # median of plain_runs
    mmunlearn_seconds: float
    plain_tokens_per_s: float
    mmunlearn_tokens_per_s: float
    ratio: float  # mmunlearn_tokens_per_s / plain_tokens_per_s
    plain_speedup: float = 1.0  # plain tokens/s against plain float32 of the same stage
    mmunlearn_speedup: float = 1.0
    accuracy: dict[str, Any] = field(default_factory=dict)
    agreement: str = ""  # the accuracy in words

    @property
    def goal_met(self) -> bool:
        return self.ratio >= GOAL_RATIO

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "goal_met": self.goal_met}


@dataclass
class Check:
    """A bound the run is held to, and whether it held."""

    name: str
    passed: bool
    measured: str
    #: goal (tokens/s ratio), accuracy (bf16 against float32), memorised (a bound meant for a memorised
    #: model), same (the two implementations compute the same thing)
    kind: str = "accuracy"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PrecisionResult:
    model: str
    parameters: int
    data: str
    split: str
    batch: int  # QA rows per batch
    batch_tokens: int  # real tokens of the training / scoring batch
    answer_tokens: int  # of which labelled (answer) tokens
    new_tokens: int
    repeats: int
    threads: int
    rows: list[PrecisionRow] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    weights_changed: bool | None = None  # after the train stage (None: not run)
    bf16_copy_seconds: float | None = None  # entering bf16_generation (one bf16 copy), outside the timings

    @property
    def goal_met(self) -> bool:
        return all(r.goal_met for r in self.rows)

    def row(self, stage: str, precision: str) -> PrecisionRow:
        for r in self.rows:
            if r.stage == stage and r.precision == precision:
                return r
        raise KeyError(f"no row for stage {stage!r} at precision {precision!r}")

    def to_dict(self) -> dict[str, Any]:
        plain = {k: v for k, v in asdict(self).items() if k not in ("rows", "checks")}
        return {**plain, "goal_ratio": GOAL_RATIO, "goal_met": self.goal_met,
                "rows": [r.to_dict() for r in self.rows], "checks": [c.to_dict() for c in self.checks]}


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
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "avx512_bf16": "avx512_bf16" in flags if flags else None,
            "amx_bf16": "amx_bf16" in flags if flags else None, "load_1min_before": _load()}


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


def _autocast(bf16: bool) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _adapter_precision(precision: str) -> str:
    return "bf16" if precision == "bf16" else "no"


# ---------------------------------------------------------------------------------------------- timing
Timed = dict[tuple[str, str], Callable[[], Any]]


def interleaved(calls: Timed, repeats: int) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], Any]]:
    """Seconds of ``repeats`` calls of each entry after one warm-up call each, and each entry's last output.

    Each round calls every entry once; the order is reversed every other round."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    outputs = {key: fn() for key, fn in calls.items()}  # warm-up: first-call allocation, kernel choice
    runs: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    keys = list(calls)
    for r in range(repeats):
        for key in keys if r % 2 == 0 else keys[::-1]:
            t0 = time.perf_counter()
            outputs[key] = calls[key]()
            runs[key].append(time.perf_counter() - t0)
    return runs, outputs


def _rows(stage: str, runs: dict[tuple[str, str], list[float]], tokens: dict[str, int],
          accuracy: dict[str, dict[str, Any]], words: dict[str, str]) -> list[PrecisionRow]:
    rows = []
    for prec in PRECISIONS:
        if ("plain", prec) not in runs:
            continue
        p_sec, m_sec = statistics.median(runs["plain", prec]), statistics.median(runs["mmunlearn", prec])
        p_tps, m_tps = tokens[prec] / p_sec, tokens[prec] / m_sec
        rows.append(PrecisionRow(stage, prec, tokens[prec], runs["plain", prec], runs["mmunlearn", prec], p_sec,
                                 m_sec, p_tps, m_tps, m_tps / p_tps, accuracy=accuracy.get(prec, {}),
                                 agreement=words.get(prec, "")))
    ref = rows[0]
    for r in rows:
        r.plain_speedup = r.plain_tokens_per_s / ref.plain_tokens_per_s
        r.mmunlearn_speedup = r.mmunlearn_tokens_per_s / ref.mmunlearn_tokens_per_s
    return rows


# ---------------------------------------------------------------------------------------------- stages
def _train_stage(net: nn.Module, tokenizer, batch: dict[str, torch.Tensor], precisions: Sequence[str],
                 repeats: int, max_length: int) -> tuple[list[PrecisionRow], list[Check]]:
    """AdamW steps on ``net`` itself (it keeps training: no copy, no restore)."""
    net.train()
    adapters = {p: TextLLMAdapter(net, tokenizer, max_length=max_length, precision=_adapter_precision(p))
                for p in precisions}
    opt = torch.optim.AdamW(net.parameters(), lr=TRAIN_LR)

    def plain_loss(prec: str) -> torch.Tensor:
        with _autocast(prec == "bf16"):
            return net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       labels=batch["labels"]).loss

    def step(loss: torch.Tensor) -> float:
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    with torch.no_grad():  # accuracy at the starting weights, before any step
        start = {(impl, p): float(plain_loss(p) if impl == "plain" else adapters[p].loss(batch))
                 for p in precisions for impl in IMPLEMENTATIONS}
    calls: Timed = {}
    for p in precisions:
        calls["plain", p] = lambda p=p: step(plain_loss(p))
        calls["mmunlearn", p] = lambda p=p: step(adapters[p].loss(batch))
    runs, _ = interleaved(calls, repeats)
    net.eval()
    ref = start["mmunlearn", precisions[0]]
    accuracy, words, checks = {}, {}, []
    for p in precisions:
        mm, plain = start["mmunlearn", p], start["plain", p]
        accuracy[p] = {"loss": mm, "plain_loss": plain, "loss_minus_float32": mm - ref}
        words[p] = (f"loss {mm:.4f} ({mm - ref:+.4f} vs float32); plain {plain:.4f}" if p != precisions[0]
                    else f"loss {mm:.4f}; plain {plain:.4f}")
        checks.append(Check(f"train {p}: the answer-only loss equals the plain loop's (|diff| <= 1e-3 x loss)",
                            abs(mm - plain) <= 1e-3 * max(1.0, abs(plain)), f"{mm:.5f} vs {plain:.5f}", "same"))
    tokens = int(batch["attention_mask"].sum())
    return _rows("train", runs, {p: tokens for p in precisions}, accuracy, words), checks


def _score_stage(ref: nn.Module, tokenizer, items: Sequence[Any], batch: dict[str, torch.Tensor],
                 precisions: Sequence[str], repeats: int, max_length: int) -> tuple[list[PrecisionRow], list[Check]]:
    adapters = {p: TextLLMAdapter(ref, tokenizer, max_length=max_length, precision=_adapter_precision(p))
                for p in precisions}
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
    runs, out = interleaved(calls, repeats)
    nll = {key: v.double() for key, v in out.items()}
    base = nll["mmunlearn", precisions[0]]
    accuracy, words, checks = {}, {}, []
    for p in precisions:
        mm = nll["mmunlearn", p]
        gap = float((mm - base).abs().mean())
        accuracy[p] = {"mean_nll": float(mm.mean()), "mean_abs_nll_diff_vs_float32": gap,
                       "max_abs_nll_diff_vs_float32": float((mm - base).abs().max()),
                       "mean_nll_diff_vs_float32": float(mm.mean() - base.mean()),
                       "max_abs_nll_diff_vs_plain": float((mm - nll["plain", p]).abs().max())}
        words[p] = (f"mean NLL {float(mm.mean()):.4f}; vs float32 mean abs diff {gap:.4f} nats"
                    f" (max {accuracy[p]['max_abs_nll_diff_vs_float32']:.4f})")
        if p == "bf16":
            checks.append(Check(f"score bf16: mean |answer NLL - float32's| <= {SCORE_NLL_BOUND} nats",
                                gap <= SCORE_NLL_BOUND, f"{gap:.4f} nats"))
        checks.append(Check(f"score {p}: answer_nll equals the plain loop's NLL (max |diff| <= 0.02 nats)",
                            accuracy[p]["max_abs_nll_diff_vs_plain"] <= 0.02,
                            f"max |diff| {accuracy[p]['max_abs_nll_diff_vs_plain']:.2e} nats", "same"))
    tokens = int(batch["attention_mask"].sum())
    return _rows("score", runs, {p: tokens for p in precisions}, accuracy, words), checks


def _generate_stage(ref: nn.Module, tokenizer, questions: list[str], precisions: Sequence[str], repeats: int,
                    new_tokens: int, max_length: int) -> tuple[list[PrecisionRow], list[Check], float | None]:
    adapters = {p: TextLLMAdapter(ref, tokenizer, max_length=max_length, precision=_adapter_precision(p))
                for p in precisions}
    first = adapters[precisions[0]]
    prompts = first.prompt_batch(questions)
    width = prompts["input_ids"].shape[1]
    models = {p: (copy.deepcopy(ref).to(torch.bfloat16).eval() if p == "bf16" else ref) for p in precisions}

    @torch.no_grad()
    def plain_generate(prec: str) -> torch.Tensor:
        out = models[prec].generate(**prompts, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=first.pad_id, eos_token_id=first.eos_id)
        return out[:, width:]

    calls: Timed = {}
    for p in precisions:
        calls["plain", p] = lambda p=p: plain_generate(p)
        calls["mmunlearn", p] = lambda p=p: adapters[p].generate(questions, max_new_tokens=new_tokens,
                                                                 batch_size=len(questions))
    copy_seconds = None
    with contextlib.ExitStack() as stack:
        if "bf16" in adapters:
            t0 = time.perf_counter()
            stack.enter_context(adapters["bf16"].bf16_generation())  # its bf16 copy, made once
            copy_seconds = time.perf_counter() - t0
        runs, out = interleaved(calls, repeats)
    texts = {p: [t.strip() for t in tokenizer.batch_decode(out["plain", p], skip_special_tokens=True)]
             for p in precisions}
    base = out["mmunlearn", precisions[0]]
    accuracy, words, checks, tokens = {}, {}, [], {}
    for p in precisions:
        answers = out["mmunlearn", p]
        same = sum(a == b for a, b in zip(answers, base))
        as_plain = sum(a == b for a, b in zip(answers, texts[p]))
        tokens[p] = len(questions) * int(out["plain", p].shape[1])
        accuracy[p] = {"same_as_float32": same, "answers": len(answers), "share_same_as_float32": same / len(answers),
                       "same_as_plain": as_plain, "decoding_steps": int(out["plain", p].shape[1])}
        words[p] = f"{same}/{len(answers)} answers identical to float32 ({100 * same / len(answers):.0f} %)"
        if p == "bf16":
            checks.append(Check(f"generate bf16: >= {100 * GENERATE_SAME_GOAL:.0f} % of greedy answers identical "
                                "to float32 (the bound applies to a memorised model)",
                                same >= GENERATE_SAME_GOAL * len(answers), f"{same}/{len(answers)}", "memorised"))
        checks.append(Check(f"generate {p}: the adapter's answers equal the plain loop's",
                            as_plain == len(answers), f"{as_plain}/{len(answers)}", "same"))
    return _rows("generate", runs, tokens, accuracy, words), checks, copy_seconds


# ---------------------------------------------------------------------------------------------- run
def run(model: str | tuple[nn.Module, Any] = "smollm2-135m", *, data: str = "synthetic", split: str = "forget10",
        batch: int = 16, new_tokens: int = 32, repeats: int = 3, stages: Sequence[str] = STAGES,
        precisions: Sequence[str] = PRECISIONS, max_length: int | None = None,
        progress: Callable[[str], None] | None = None) -> PrecisionResult:
    """Time every stage and precision for both implementations on the first ``batch`` QA rows of ``split``.

    ``model`` is a name (:func:`load_model`) or a ``(float32 causal LM, tokenizer)`` pair; the train stage
    trains that model in place (scoring and generation use a copy of it taken before)."""
    bad = [s for s in stages if s not in STAGES] + [p for p in precisions if p not in PRECISIONS]
    if bad or not stages or not precisions:
        raise ValueError(f"stages must come from {STAGES} and precisions from {PRECISIONS}; got {bad or 'none'}")
    if list(precisions) != [p for p in PRECISIONS if p in precisions]:
        raise ValueError(f"precisions must be listed float32 first, without repeats: got {list(precisions)}")
    if batch < 1 or new_tokens < 1 or repeats < 1:
        raise ValueError(f"batch, new_tokens and repeats must be >= 1, got {batch}, {new_tokens}, {repeats}")
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
    result = PrecisionResult(model=name, parameters=sum(p.numel() for p in net.parameters()), data=str(data),
                             split=split, batch=len(items), batch_tokens=int(qa["attention_mask"].sum()),
                             answer_tokens=int((qa["labels"][:, 1:] != -100).sum()), new_tokens=new_tokens,
                             repeats=repeats, threads=torch.get_num_threads(), machine=machine)
    ref = copy.deepcopy(net).eval()  # scoring and generation: the starting weights, whatever training does
    if "train" in stages:
        say(f"train: forward + backward + AdamW step on {len(items)} QA, {', '.join(precisions)}, plain and mmunlearn")
        rows, checks = _train_stage(net, tokenizer, qa, precisions, repeats, limit)
        result.rows += rows
        result.checks += checks
        result.weights_changed = any(not torch.equal(a, b) for a, b in zip(net.parameters(), ref.parameters()))
    if "score" in stages:
        say("score: teacher-forced answer NLL, plain (full logits) and mmunlearn (answer_nll)")
        rows, checks = _score_stage(ref, tokenizer, items, qa, precisions, repeats, limit)
        result.rows += rows
        result.checks += checks
    if "generate" in stages:
        say(f"generate: greedy decoding with the KV cache, up to {new_tokens} new tokens")
        rows, checks, result.bf16_copy_seconds = _generate_stage(ref, tokenizer, [i.question for i in items],
                                                                 precisions, repeats, new_tokens, limit)
        result.rows += rows
        result.checks += checks
    result.checks += [Check(f"{r.stage} {r.precision}: mmunlearn tokens/s >= {GOAL_RATIO}x the plain loop's",
                            r.goal_met, f"{r.ratio:.2f}x", "goal") for r in result.rows]
    result.machine["load_1min_after"] = _load()
    return result


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ("stage", "precision", "plain tok/s", "mmunlearn tok/s", "mmunlearn/plain",
           "speed-up vs float32 (plain / mmunlearn)", "accuracy")


def table_rows(res: PrecisionResult) -> list[tuple[str, ...]]:
    """The printed table's cells, one tuple per row (:data:`COLUMNS`)."""
    return [(r.stage, r.precision, f"{r.plain_tokens_per_s:.1f}", f"{r.mmunlearn_tokens_per_s:.1f}",
             f"{r.ratio:.2f}x", f"{r.plain_speedup:.2f}x / {r.mmunlearn_speedup:.2f}x", r.agreement)
            for r in res.rows]


def goal_lines(res: PrecisionResult) -> list[str]:
    """One line per row: "goal met" or "GOAL MISSED by ..." against :data:`GOAL_RATIO`."""
    return [f"{r.stage} {r.precision}: mmunlearn/plain {r.ratio:.2f}x: "
            + ("goal met" if r.goal_met else f"GOAL MISSED by {GOAL_RATIO - r.ratio:.2f}")
            + f" (>= {GOAL_RATIO}x)" for r in res.rows]


def facts_line(res: PrecisionResult) -> str:
    m = res.machine
    return (f"{res.threads} torch thread(s); {m.get('cores')} cores ({m.get('cpu')}); torch {m.get('torch')}; "
            f"avx512_bf16 {m.get('avx512_bf16')}; load average (1 min) {m.get('load_1min_before')} before, "
            f"{m.get('load_1min_after')} after")


def markdown(res: PrecisionResult) -> str:
    """The table, the goal lines, the checks and the machine facts as Markdown."""
    right = {2, 3, 4, 5}
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(COLUMNS))) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(res)]
    lines += ["", *[f"- {line}" for line in goal_lines(res)], ""]
    lines += [f"- {'PASS' if c.passed else 'MISS'} {c.name}: {c.measured}" for c in res.checks if c.kind != "goal"]
    lines += ["", facts_line(res)]
    return "\n".join(lines)
