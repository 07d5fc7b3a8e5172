"""TOFU recipe (``mmunlearn tofu ...``): target/retain models, evaluation, unlearning, comparison.

Read top to bottom: ``finetune`` and ``eval`` are the harness; ``run`` unlearns with one method
and evaluates; ``compare`` runs every method on the same target and split and writes one table
(Markdown, CSV, JSON) and a scatter plot; ``tilt`` trains a T3 head for any model and data files.

Fine-tuning options (``finetune --epochs/--lr/--batch-size/--grad-accum/--max-steps/--precision``;
the same as ``--ft-*`` on ``run`` and ``compare``, where ``--lr``/``--epochs`` are the baselines')
change the preset's settings for the models built (part of their cache key). ``run``, ``compare``
and ``eval`` take ``--target DIR`` / ``--retain-model DIR`` (e.g. made by ``finetune --out DIR``)
instead of building those models. After building, the target is checked for having memorised the
forget answers (:mod:`recipes.tofu_settings`); a warning is printed and ``memorised: false`` recorded
in compare.json / run.json when it did not.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from mmunlearn.atomic import write_text_atomic
from recipes import tofu_pipeline, tofu_report
from recipes.tofu_settings import memorisation, memorisation_warning, sweep_rule

app = typer.Typer(help="TOFU: fine-tune target/retain models, evaluate, unlearn, compare methods.", no_args_is_help=True)
console = Console()

Data = Annotated[str, typer.Option(help="TOFU folder of JSON splits, a hub id, or 'synthetic[:n_authors=40,...]' (built in).")]
Preset = Annotated[str, typer.Option(help="Model preset: micro (tests), mini (CPU demo), or a model directory to fine-tune.")]
Authors = Annotated[Optional[int], typer.Option(help="Keep N authors: the first retain authors plus forget authors in proportion.")]
ForgetSplit = Annotated[str, typer.Option(help="Forget split: forget01, forget05 or forget10.")]
Seed = Annotated[int, typer.Option(help="Seed of data order and initialisation.")]
Device = Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")]
CacheDir = Annotated[Optional[Path], typer.Option(help="Where built models are cached (default ~/.cache/mmunlearn).")]
Base = Annotated[str, typer.Option(help="Task-vector reference for erasure methods: target, base (the preset's pretrained base) or a model directory.")]
RetainBound = Annotated[float, typer.Option(help="Sweep rule: largest allowed rise of the retain NLL (nats).")]
Threads = Annotated[Optional[int], typer.Option(help="torch CPU threads (default without CUDA: 1, measured 1.6-6.5x faster in wall time than 2 for SmolLM2 training and scoring on this project's shared 2-core CPU; with CUDA: torch's choice).")]
Target = Annotated[Optional[Path], typer.Option(help="Target model folder (e.g. from `tofu finetune --out DIR`) to use instead of building the preset's target; its train_log.json names its base.")]
RetainModel = Annotated[Optional[Path], typer.Option(help="Retain model folder (never trained on the forget authors) to use instead of building the preset's retain model.")]
Metrics = Annotated[Optional[str], typer.Option(help="Metric groups to compute, comma-separated: forget, memorization, utility, mia (default: all).")]
Extract = Annotated[Optional[str], typer.Option(help="Erasure task vectors: finetune, lora or gradient (default: the method's).")]
ExtractSteps = Annotated[Optional[int], typer.Option(help="Erasure: optimizer steps of the task-vector extraction (finetune, lora).")]
FtEpochs = Annotated[Optional[int], typer.Option("--ft-epochs", help="Fine-tuning of the built target and retain models: epochs (default: the preset's).")]
FtLr = Annotated[Optional[float], typer.Option("--ft-lr", help="Fine-tuning of the built target and retain models: learning rate.")]
FtBatch = Annotated[Optional[int], typer.Option("--ft-batch-size", help="Fine-tuning of the built target and retain models: micro-batch size.")]
FtAccum = Annotated[Optional[int], typer.Option("--ft-grad-accum", help="Fine-tuning of the built target and retain models: gradient accumulation steps.")]
FtMaxSteps = Annotated[Optional[int], typer.Option("--ft-max-steps", help="Fine-tuning of the built target and retain models: at most N optimizer steps (the schedule fitted to them).")]
FtPrecision = Annotated[Optional[str], typer.Option("--ft-precision", help="Fine-tuning of the built target and retain models: no, bf16 (autocast, also on CPU) or auto (bf16 on a GPU that has it).")]
PRECISION_CHOICES = ("no", "bf16", "auto")
Precision = Annotated[Optional[str], typer.Option("--precision", help="Scoring and generation precision: no (float32) or bf16 (autocast scoring, bf16 weights for greedy generation; measured 2-3x faster on a CPU with AVX512_BF16). Default: bf16 for smollm2-135m, no otherwise.")]
MaxNewTokens = Annotated[str, typer.Option(help="Greedy generation length for ROUGE: a number (the reference uses 200) or 'auto' (lean: per batch, its longest gold answer in tokens + 16).")]
UtilityItems = Annotated[Optional[int], typer.Option(help="Evaluate only the first N real-authors and N world-facts items (lean; default: all 100 + 117, the reference). Recorded in the logs.")]
RuleRetain = Annotated[Optional[int], typer.Option(help="The sweep rule scores N retain rows spread over the retain partition (default: all of it); fewer makes every sweep point cheaper.")]
Resume = Annotated[bool, typer.Option(help="Reuse a method's finished stage (same method, options, rule and models: its run.json key) instead of redoing it.")]
AuditFlag = Annotated[bool, typer.Option("--audit", help="Also run the robustness audits (paraphrase, 8/4-bit quantisation, relearning, probe) on every method's model: <out>/AUDIT.json and AUDIT.md beside compare.md, and <out>/<method>/AUDIT.json.")]
AuditSteps = Annotated[Optional[int], typer.Option("--audit-relearn-steps", help="--audit: relearning optimizer steps (default 20).")]
AuditLr = Annotated[Optional[float], typer.Option("--audit-relearn-lr", help="--audit: relearning learning rate (default: 1e-3 for micro/mini, 1e-5 for a model directory).")]
AuditOn = Annotated[Optional[str], typer.Option("--audit-relearn-on", help="--audit: relearn on part of the forget set ('forget', default) or on retain data only ('retain', stricter).")]
AuditAttacks = Annotated[Optional[str], typer.Option("--audit-attacks", help="--audit: attacks to run, comma-separated (paraphrase, quantise, relearn, probe; default all).")]


def _threads(n: int | None) -> None:
    import torch

    from mmunlearn.errors import set_threads

    set_threads(n if n is not None else None if torch.cuda.is_available() else 1)


def _train_overrides(epochs: int | None, lr: float | None, batch_size: int | None, grad_accum: int | None,
                     max_steps: int | None, precision: str | None, prefix: str = "--") -> dict[str, Any]:
    """Fine-tuning options as ``build_models``/``finetune`` overrides, checked (a usage error otherwise)."""
    from mmunlearn.train import TrainConfig

    if precision is not None and precision not in PRECISION_CHOICES:
        raise typer.BadParameter(f"choose from {', '.join(PRECISION_CHOICES)}, got {precision!r}",
                                 param_hint=f"{prefix}precision")
    if max_steps is not None and max_steps < 1:
        raise typer.BadParameter(f"must be a positive integer, got {max_steps}", param_hint=f"{prefix}max-steps")
    fields = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "grad_accum": grad_accum,
              "mixed_precision": precision}
    overrides = {k: v for k, v in fields.items() if v is not None}
    try:
        TrainConfig(epochs=1).replace(**overrides)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return {**overrides, **({"max_steps": max_steps} if max_steps is not None else {})}


def _max_new_tokens(text: str) -> int | str:
    from mmunlearn.eval.tofu import check_max_new_tokens

    try:
        return check_max_new_tokens("auto" if text.strip() == "auto" else int(text))
    except ValueError:
        raise typer.BadParameter(f"a positive integer or 'auto', got {text!r}", param_hint="--max-new-tokens") from None


def _precision(value: str | None) -> str | None:
    from mmunlearn.adapters.text_llm import PRECISIONS

    if value is not None and value not in PRECISIONS:
        raise typer.BadParameter(f"choose from {', '.join(PRECISIONS)}, got {value!r}", param_hint="--precision")
    return value


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be a positive integer, got {value}", param_hint=flag)
    return value


def _metrics(text: str | None) -> tuple[str, ...] | None:
    try:
        return tofu_pipeline.parse_metrics(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--metrics") from None


def _extract(kind: str | None, steps: int | None) -> dict[str, Any]:
    from mmunlearn.taskvec.extract import KINDS

    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"choose from {', '.join(KINDS)}, got {kind!r}", param_hint="--extract")
    if steps is not None and steps < 1:
        raise typer.BadParameter(f"must be a positive integer, got {steps}", param_hint="--extract-steps")
    return {"extract_kind": kind, "extract_steps": steps}


def _model_dir(path: Path | None, flag: str) -> Path | None:
    if path is None:
        return None
    try:
        return tofu_pipeline.check_model_dir(path)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=flag) from None


def _given_models(target: Path | None, retain_model: Path | None, base: str, sweep: bool,
                  overrides: dict[str, Any], preset: str) -> tuple[Path | None, Path | None]:
    """Check --target / --retain-model and what needs the target's base (before any model work)."""
    from mmunlearn.presets.cache import read_log
    from recipes.tofu_settings import preset_size

    target, retain_model = _model_dir(target, "--target"), _model_dir(retain_model, "--retain-model")
    made_by = (read_log(target) or {}).get("preset") if target is not None else None
    if isinstance(made_by, str) and preset_size(made_by) != preset_size(preset):
        console.print(f"warning: the target was fine-tuned from preset {made_by!r} and the methods use the "
                      f"settings of --preset {preset!r} ({preset_size(preset)}); pass the preset the target was made with",
                      style="yellow", markup=False, soft_wrap=True)
    if target is not None and tofu_pipeline.target_base(target) is None:
        if base == "base":
            raise typer.BadParameter(f"the target {target} names no base model (no train_log.json with an existing "
                                     f"'base'); pass --base DIR or --base target", param_hint="--base")
        if sweep:
            raise typer.BadParameter(f"the sweep aims at the base model's forget NLL and the target {target} names "
                                     f"no base model (no train_log.json with an existing 'base'); pass --no-sweep",
                                     param_hint="--sweep")
    if overrides and target is not None and retain_model is not None:
        console.print("[yellow]warning:[/yellow] the --ft-* options are ignored: --target and --retain-model "
                      "are given, no model is built")
    return target, retain_model


def _audit_options(preset: str, steps: int | None, lr: float | None, on: str | None, attacks: str | None,
                   max_new_tokens: int = 64):
    """``--audit-*`` as :class:`mmunlearn.audit.AuditOptions` for the preset (a usage error when invalid);
    the audit's generations are at most 64 tokens (fewer when --max-new-tokens says so)."""
    from mmunlearn.audit import ATTACKS
    from mmunlearn.audit.options import parse_list
    from recipes.tofu_settings import audit_options

    try:
        return audit_options(preset, relearn_steps=steps, relearn_lr=lr, relearn_on=on,
                             attacks=parse_list(attacks, ATTACKS, "--audit-attacks"),
                             max_new_tokens=min(64, max_new_tokens))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--audit-*") from None


def _warn_memorisation(ctx) -> None:
    message = memorisation_warning(ctx.memorisation, hint="--ft-epochs/--ft-lr (tofu finetune: --epochs/--lr)")
    if message:
        console.print(f"warning: {message}", style="bold yellow", markup=False, soft_wrap=True)


def _lean(max_new_tokens: str, utility_items: int | None, precision: str | None,
          rule_retain_items: int | None) -> dict[str, Any]:
    """The evaluation-cost options, checked (usage errors otherwise), as :func:`tofu_pipeline.prepare` takes them."""
    return {"max_new_tokens": _max_new_tokens(max_new_tokens), "precision": _precision(precision),
            "utility_items": _positive(utility_items, "--utility-items"),
            "rule_retain_items": _positive(rule_retain_items, "--rule-retain-items")}


class _Stages:
    """One progress line per finished stage of a comparison: its time, the elapsed time and an estimate of
    what remains (the mean of the stages run so far, reused ones not counted, times those left)."""

    def __init__(self, total: int, start: float):
        self.total, self.start, self.finished, self.times = total, start, 0, []

    def done(self, name: str, seconds: float, reused: bool = False, setup: bool = False) -> None:
        self.finished += 1
        if not reused and not setup:  # the models' build is no guide to a method's time
            self.times.append(seconds)
        left = self.total - self.finished
        estimate = (sum(self.times) / len(self.times) * left) if self.times and left else 0.0
        console.print(f"[stage {self.finished}/{self.total}] {name}: "
                      + ("reused (finished earlier)" if reused else f"{seconds:.0f} s")
                      + f"; elapsed {time.perf_counter() - self.start:.0f} s"
                      + (f"; about {estimate / 60:.0f} min left" if left and self.times else ""),
                      markup=False, soft_wrap=True)


@app.command()
def finetune(
    out: Annotated[Path, typer.Option(help="Directory for the fine-tuned model (save_pretrained layout).")],
    data: Data = "synthetic",
    split: Annotated[str, typer.Option(help="Training split: full, retain90, retain95, retain99, ...")] = "full",
    preset: Preset = "micro",
    authors: Authors = None,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
    epochs: Annotated[Optional[int], typer.Option(help="Epochs over the split (default: the preset's).")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (default: the preset's).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Micro-batch size (default: the preset's).")] = None,
    grad_accum: Annotated[Optional[int], typer.Option(help="Gradient accumulation steps (default: the preset's).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="At most N optimizer steps: a longer run becomes N steps, its schedule fitted to them.")] = None,
    precision: Annotated[Optional[str], typer.Option(help="no, bf16 (autocast, also on CPU) or auto (bf16 on a GPU that has it; default: the preset's).")] = None,
    forget_pct: Annotated[float, typer.Option(help="With --authors and --split full: the forget share (as forgetPP), whose rows' answer NLL is checked.")] = 10,
) -> None:
    """Fine-tune a model on one split (a preset first pretrains its base on a corpus disjoint from TOFU).

    A stopped run resumes from its last saved state when re-run with the same options. On a split with
    forget authors (full, forgetPP) the answer NLL of the forget rows is recorded in train_log.json
    (forget_answer_nll) and a warning printed when it is above the memorisation bound.
    """
    from mmunlearn.presets.build import finetune as build_one

    _threads(threads)
    overrides = _train_overrides(epochs, lr, batch_size, grad_accum, max_steps, precision)
    path = build_one(preset, data, split, authors, out, forget_pct=forget_pct, seed=seed, cache_dir=cache_dir,
                     device=device, overrides=overrides)
    log = json.loads((path / "train_log.json").read_text())
    console.print(f"fine-tuned model in [bold]{path}[/bold]; final answer loss {log.get('final_loss', float('nan')):.4f}")
    forget_nll = log.get("forget_answer_nll")
    if forget_nll is not None:
        console.print(f"forget rows ({log.get('forget_examples')}): answer NLL {forget_nll:.4f}, probability "
                      f"{log.get('forget_prob', float('nan')):.3f} (pretrained "
                      f"{_num(log.get('pretrained_forget_prob'))}), greedy ROUGE-L {_num(log.get('forget_rouge'))}")
    check = memorisation(preset, log.get("forget_prob"), log.get("forget_rouge"),
                         pretrained_prob=log.get("pretrained_forget_prob"))
    message = memorisation_warning(check, what="the model")
    if message:
        console.print(f"warning: {message}", style="bold yellow", markup=False, soft_wrap=True)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option("--model", "--target", help="Model directory to evaluate (--target is the same option).")],
    out: Annotated[Path, typer.Option(help="Directory for TOFU_EVAL.json, TOFU_SUMMARY.json and TOFU_SUMMARY.md.")],
    data: Data = "synthetic",
    forget_split: ForgetSplit = "forget10",
    authors: Authors = None,
    retain_logs: Annotated[Optional[Path], typer.Option(help="The retain model's TOFU_EVAL.json (for forget quality and privleak).")] = None,
    retain_model: Annotated[Optional[Path], typer.Option(help="The retain model's folder: evaluated first (cached in its evals/ folder) for forget quality and privleak; instead of --retain-logs.")] = None,
    metrics: Metrics = None,
    batch_size: Annotated[int, typer.Option(help="Scoring batch size.")] = 16,
    max_new_tokens: MaxNewTokens = "200",
    utility_items: UtilityItems = None,
    precision: Precision = None,
    preset: Annotated[str, typer.Option(help="The preset the model was made with (its memorisation thresholds and default precision).")] = "model_dir",
    device: Device = "auto",
    threads: Threads = None,
) -> None:
    """Evaluate a model with the TOFU metric suite (reference definitions and log format); with a retain
    model, the memorisation check of the model too."""
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.eval import evaluate_tofu, summary_table

    from recipes.tofu_settings import default_precision

    _threads(threads)
    model = _model_dir(model, "--model")
    groups = _metrics(metrics)
    max_new_tokens = _max_new_tokens(max_new_tokens)
    utility_items = _positive(utility_items, "--utility-items")
    precision = _precision(precision) or default_precision(preset)
    lean = dict(precision=precision, utility_items=utility_items)
    if retain_model is not None:
        if retain_logs is not None:
            raise typer.BadParameter("give --retain-model or --retain-logs, not both", param_hint="--retain-model")
        retain_model = _model_dir(retain_model, "--retain-model")
        retain_logs = tofu_pipeline.cached_eval(retain_model, data, forget_split, authors, max_new_tokens, device,
                                                metrics=tofu_pipeline.reference_metrics(groups),
                                                fingerprint=tofu_pipeline.model_fingerprint(retain_model), **lean)
    adapter = TextLLMAdapter.from_pretrained(model, device=device, precision=precision)
    logs = evaluate_tofu(adapter, data, forget_split, authors, retain_logs=retain_logs, out_dir=out,
                         batch_size=batch_size, max_new_tokens=max_new_tokens, model_name=Path(model).name,
                         metrics=groups, utility_items=utility_items)
    console.print(summary_table(logs))
    if retain_logs is not None and "forget_Q_A_Prob" in logs:
        retain = json.loads(Path(retain_logs).read_text()) if Path(retain_logs).is_file() else {}
        check = memorisation(preset, logs["forget_Q_A_Prob"]["agg_value"],
                             (logs.get("forget_Q_A_ROUGE") or {}).get("agg_value"),
                             retain_prob=(retain.get("forget_Q_A_Prob") or {}).get("agg_value"),
                             forget_quality=(logs.get("forget_quality") or {}).get("agg_value"))
        write_text_atomic(Path(out) / "MEMORISATION.json", json.dumps(check, indent=2))
        message = memorisation_warning(check, what="the model")
        console.print(f"warning: {message}" if message else
                      f"memorised the forget answers: {check['memorised']}", markup=False, soft_wrap=True)


@app.command()
def run(
    method: Annotated[str, typer.Option(help="A method of `mmunlearn methods` (qr-erase, svd-unlearn, grad_diff, t3, rmu, ...).")],
    out: Annotated[Path, typer.Option(help="Output directory: model/ (unlearned model, undo patch, reports; `mmunlearn restore --model OUT/model` undoes it), TOFU_EVAL.json, run.json.")],
    data: Data = "synthetic",
    preset: Preset = "micro",
    forget_split: ForgetSplit = "forget10",
    authors: Authors = None,
    base: Base = "target",
    sweep: Annotated[bool, typer.Option(help="Pick rank/scale (erasure) and temperature (T3) on the training partitions.")] = False,
    retain_bound: RetainBound = 0.1,
    rank: Annotated[Optional[int], typer.Option(help="Erasure: forget rank k.")] = None,
    scale: Annotated[Optional[float], typer.Option(help="Erasure: W' = W - scale * T~.")] = None,
    extract: Extract = None,
    extract_steps: ExtractSteps = None,
    temperature: Annotated[Optional[float], typer.Option(help="T3 temperature T >= 1.")] = None,
    t3_rank: Annotated[Optional[int], typer.Option("--t3-rank", help="T3 head rank h.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Baselines: learning rate.")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Baselines: epochs over the forget set.")] = None,
    max_new_tokens: MaxNewTokens = "200",
    utility_items: UtilityItems = None,
    precision: Precision = None,
    rule_retain_items: RuleRetain = None,
    resume: Resume = True,
    metrics: Metrics = None,
    target: Target = None,
    retain_model: RetainModel = None,
    ft_epochs: FtEpochs = None,
    ft_lr: FtLr = None,
    ft_batch_size: FtBatch = None,
    ft_grad_accum: FtAccum = None,
    ft_max_steps: FtMaxSteps = None,
    ft_precision: FtPrecision = None,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Unlearn the forget split from the target model with one method, then evaluate it."""
    _threads(threads)
    overrides = _train_overrides(ft_epochs, ft_lr, ft_batch_size, ft_grad_accum, ft_max_steps, ft_precision, "--ft-")
    groups = _metrics(metrics)
    options = dict(rank=rank, scale=scale, **_extract(extract, extract_steps), temperature=temperature,
                   head_rank=t3_rank, lr=lr, epochs=epochs)
    lean = _lean(max_new_tokens, utility_items, precision, rule_retain_items)
    target, retain_model = _given_models(target, retain_model, base, sweep, overrides, preset)
    ctx = tofu_pipeline.prepare(preset, data, forget_split, authors, seed, cache_dir, device, lean.pop("max_new_tokens"),
                                overrides=overrides, target=target, retain=retain_model, metrics=groups, **lean)
    _warn_memorisation(ctx)
    rule = sweep_rule(ctx.forget_target() if sweep else None, retain_bound)
    row = tofu_pipeline.run_method_row(method, ctx, options, rule, base, out, device, resume=resume)
    console.print(tofu_report.markdown([ctx.reference_row("target"), row, ctx.reference_row("retain")]))
    _warn_memorisation(ctx)  # again below the table, where it is seen


@app.command()
def compare(
    out: Annotated[Path, typer.Option(help="Output directory: compare.md/.csv/.json, scatter plot, one folder per method.")] = Path("runs/tofu_compare"),
    methods: Annotated[str, typer.Option(help="Comma-separated methods, or 'all'.")] = "all",
    data: Data = "synthetic",
    preset: Preset = "mini",
    forget_split: ForgetSplit = "forget10",
    authors: Authors = None,
    base: Base = "target",
    sweep: Annotated[bool, typer.Option(help="Pick each method's rank/scale/temperature on the training partitions.")] = True,
    retain_bound: RetainBound = 0.1,
    max_new_tokens: MaxNewTokens = "200",
    utility_items: UtilityItems = None,
    precision: Precision = None,
    rule_retain_items: RuleRetain = None,
    resume: Resume = True,
    metrics: Metrics = None,
    extract: Extract = None,
    extract_steps: ExtractSteps = None,
    target: Target = None,
    retain_model: RetainModel = None,
    ft_epochs: FtEpochs = None,
    ft_lr: FtLr = None,
    ft_batch_size: FtBatch = None,
    ft_grad_accum: FtAccum = None,
    ft_max_steps: FtMaxSteps = None,
    ft_precision: FtPrecision = None,
    audit: AuditFlag = False,
    audit_relearn_steps: AuditSteps = None,
    audit_relearn_lr: AuditLr = None,
    audit_relearn_on: AuditOn = None,
    audit_attacks: AuditAttacks = None,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Run every method on the same target model and split; one table and a scatter plot (and, with
    --audit, the robustness audit table AUDIT.md)."""
    from mmunlearn.methods import names

    _threads(threads)
    known = names("text")
    chosen = known if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise typer.BadParameter(f"unknown methods {unknown}; choose from {known}")
    overrides = _train_overrides(ft_epochs, ft_lr, ft_batch_size, ft_grad_accum, ft_max_steps, ft_precision, "--ft-")
    groups = _metrics(metrics)
    options = _extract(extract, extract_steps)
    lean = _lean(max_new_tokens, utility_items, precision, rule_retain_items)
    audit_opts = _audit_options(preset, audit_relearn_steps, audit_relearn_lr, audit_relearn_on, audit_attacks,
                                lean["max_new_tokens"] if lean["max_new_tokens"] != "auto" else 64) if audit else None
    target, retain_model = _given_models(target, retain_model, base, sweep, overrides, preset)
    start = time.perf_counter()
    stages = _Stages(len(chosen) + 1, start)
    ctx = tofu_pipeline.prepare(preset, data, forget_split, authors, seed, cache_dir, device, lean.pop("max_new_tokens"),
                                overrides=overrides, target=target, retain=retain_model, metrics=groups, **lean)
    stages.done("target and retain models, their evaluations", time.perf_counter() - start, setup=True)
    _warn_memorisation(ctx)
    rows = [ctx.reference_row("target"), ctx.reference_row("retain")]
    # rows of methods not run now are kept from an earlier comparison of the same context
    context = {**ctx.describe(), **{k: v for k, v in options.items() if v is not None}}
    kept = tofu_report.earlier_rows(out, context, exclude=chosen)
    target_nll = ctx.forget_target() if sweep else None
    audits, audit_cache = [], {}
    for name in chosen:
        t0 = time.perf_counter()
        rows.append(tofu_pipeline.run_method_row(name, ctx, options, sweep_rule(target_nll, retain_bound), base,
                                                 out / name, device, resume=resume))
        tofu_report.write_tables(out, tofu_report.ordered(rows + kept), context)  # nothing lost if interrupted
        stages.done(name, time.perf_counter() - t0, reused=bool(rows[-1].get("reused")))
        if audit_opts is not None:
            console.print(f"auditing {name} ...")
            audits.append(tofu_pipeline.audit_method(name, ctx, out / name, audit_opts, device, audit_cache))
            tofu_report.write_audit_table(out, audits + tofu_pipeline.earlier_audits(out, [r["method"] for r in kept]),
                                          context)
    rows = tofu_report.ordered(rows + kept)
    tofu_report.scatter(out / "fq_vs_mu.png", rows)
    if sweep:
        tofu_report.selectivity_plot(out / "selectivity.png", out, [r["method"] for r in rows], target_nll)
    console.print(tofu_report.markdown(rows))
    if audit_opts is not None:
        console.print((out / "AUDIT.md").read_text(), markup=False, soft_wrap=True)
    _warn_memorisation(ctx)  # again below the table, where it is seen
    total = time.perf_counter() - start
    tofu_report.write_tables(out, rows, {**context, "wall_seconds": total})
    console.print(f"wrote {out}/compare.md, .csv, .json and fq_vs_mu.png"
                  + (" and AUDIT.md / AUDIT.json" if audit_opts is not None else "")
                  + f"; the whole command took {total:.0f} s ({total / 60:.1f} min)")


@app.command()
def tilt(
    model: Annotated[Path, typer.Option(help="Model directory (frozen base).")],
    retain: Annotated[Path, typer.Option(help="Retain QA: a JSON list of {question, answer}.")],
    forget: Annotated[Path, typer.Option(help="Forget QA: a JSON list of {question, answer}.")],
    out: Annotated[Path, typer.Option(help="Directory for the tilt head and its settings.")],
    rank: Annotated[int, typer.Option(help="Head rank h.")] = 20,
    temperature: Annotated[float, typer.Option(help="Temperature T >= 1 stored with the head.")] = 1.0,
    epochs: Annotated[int, typer.Option(help="Full-batch epochs over the cached states.")] = 100,
    lr: Annotated[float, typer.Option(help="Head learning rate.")] = 1e-2,
    cache_dir: CacheDir = None,
    device: Device = "auto",
) -> None:
    """Train a T3 tilt head for any model directory and QA files."""
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.data.tofu import load_split
    from mmunlearn.tilt import TiltedCausalLM
    from mmunlearn.tilt.train import train_tilt

    adapter = TextLLMAdapter.from_pretrained(model, device=device)
    r_items = load_split(retain.parent, retain.stem)
    f_items = load_split(forget.parent, forget.stem)
    fit = train_tilt(adapter, r_items, f_items, rank=rank, epochs=epochs, lr=lr,
                     cache_dir=cache_dir or (out.parent / ".tilt_cache"))
    TiltedCausalLM(adapter.model, fit.head, temperature, base_path=str(model.resolve())).save(out)
    console.print(fit.summary())
    console.print(f"tilt head written to [bold]{out}[/bold]")
