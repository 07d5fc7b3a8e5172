"""TOFU recipe (``mmunlearn tofu ...``): target/retain models, evaluation, unlearning, comparison.

Read top to bottom: ``finetune`` and ``eval`` are the harness; ``run`` unlearns with one method
and evaluates; ``compare`` runs every method on the same target and split and writes one table
(Markdown, CSV, JSON) and a scatter plot; ``tilt`` trains a T3 head for any model and data files.

Fine-tuning settings (``finetune epochs=/lr=/batch_size=/grad_accum=/max_steps=/precision=``, or
``--epochs 1`` as they were once spelled; the same as ``ft_*`` on ``run`` and ``compare``, where ``lr``/``epochs``
are the baselines') change the preset's settings for the models built (part of their cache key). ``run``, ``compare``
and ``eval`` take ``--target DIR`` / ``--retain-model DIR`` (e.g. made by ``finetune --out DIR``)
instead of building those models. After building, the target is checked for having memorised the
forget answers (:mod:`recipes.tofu.settings`); a warning is printed and ``memorised: false`` recorded
in compare.json / run.json when it did not.

``run`` and ``compare`` take their settings as one :class:`recipes.tofu.config.TofuConfig`: the options (one per
field, declared once there), ``--config FILE.yaml``, ``--method-option METHOD.SETTING=VALUE`` and ``KEY=VALUE``
arguments (:mod:`recipes.recipe_cli`); each method runs through :func:`recipes.runner.run_method`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.config import opt
from mmunlearn.config.command import settings_command
from mmunlearn.data.user.sets import overlap, read_text_rows
from mmunlearn.errors import set_threads
from mmunlearn.eval import evaluate_tofu, summary_table
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.presets.build import finetune as build_one
from mmunlearn.presets.cache import read_log
from recipes.recipe_cli import config_command, configs_command, help_of, require
from recipes.rehearsal import host_precision, rehearsal_of
from recipes.runner import Comparison, Stages, run_comparison, run_method
from recipes.tofu import pipeline as tofu_pipeline
from recipes.tofu import report as tofu_report
from recipes.tofu.config import COMPARE_EXCLUDES, RUN_EXCLUDES, TofuConfig, train_overrides
from recipes.tofu.parallel import pending, run_jobs
from recipes.tofu.settings import (
    default_precision,
    memorisation,
    memorisation_warning,
    parse_metrics,
    preset_size,
    sweep_rule,
)

app = typer.Typer(
    help="TOFU: fine-tune target/retain models, evaluate, unlearn, compare methods.", no_args_is_help=True
)
console = Console()

Data = Annotated[str, typer.Option(help=help_of(TofuConfig, "data"))]
Preset = Annotated[str, typer.Option(help=help_of(TofuConfig, "preset"))]
Authors = Annotated[int | None, typer.Option(help=help_of(TofuConfig, "authors"))]
ForgetSplit = Annotated[str, typer.Option(help=help_of(TofuConfig, "forget_split"))]
Seed = Annotated[int, typer.Option(help=help_of(TofuConfig, "seed"))]
Device = Annotated[str, typer.Option(help=help_of(TofuConfig, "device"))]
CacheDir = Annotated[Path | None, typer.Option(help=help_of(TofuConfig, "cache_dir"))]
Threads = Annotated[int | None, typer.Option(help=help_of(TofuConfig, "threads"))]
Metrics = Annotated[str | None, typer.Option(help=help_of(TofuConfig, "metrics"))]


def _threads(n: int | None) -> None:
    import torch

    set_threads(n if n is not None else None if torch.cuda.is_available() else 1)


def _metrics(text: str | None) -> tuple[str, ...] | None:
    try:
        return parse_metrics(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--metrics") from None


def _model_dir(path: Path | None, flag: str) -> Path | None:
    if path is None:
        return None
    try:
        return tofu_pipeline.check_model_dir(path)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=flag) from None


def _given_models(cfg: TofuConfig, overrides: dict[str, Any]) -> tuple[Path | None, Path | None]:
    """Check --target / --retain-model and what needs the target's base (before any model work)."""
    target, retain_model = _model_dir(cfg.target, "--target"), _model_dir(cfg.retain_model, "--retain-model")
    made_by = (read_log(target) or {}).get("preset") if target is not None else None
    if isinstance(made_by, str) and preset_size(made_by) != preset_size(cfg.preset):
        console.print(
            f"warning: the target was fine-tuned from preset {made_by!r} and the methods use the "
            f"settings of --preset {cfg.preset!r} ({preset_size(cfg.preset)}); pass the preset the target "
            f"was made with",
            style="yellow",
            markup=False,
            soft_wrap=True,
        )
    if target is not None and tofu_pipeline.target_base(target) is None:
        if cfg.base == "base":
            raise typer.BadParameter(
                f"the target {target} names no base model (no train_log.json with an existing "
                f"'base'); pass --base DIR or --base target",
                param_hint="--base",
            )
        if cfg.sweep:
            raise typer.BadParameter(
                f"the sweep aims at the base model's forget NLL and the target {target} names "
                f"no base model (no train_log.json with an existing 'base'); pass --no-sweep",
                param_hint="--sweep",
            )
    if target is not None and retain_model is None and made_by != cfg.preset:
        raise typer.BadParameter(
            f"--target {target} without --retain-model: the reference retain model would be built from --preset "
            f"{cfg.preset!r}, {'not the preset the target was made with' if made_by else 'a model of another'} "
            "architecture and tokenizer; pass --retain-model DIR (your model fine-tuned without the forget rows)"
            + (f", or --preset {made_by}" if isinstance(made_by, str) else ""),
            param_hint="--retain-model",
        )
    if overrides and target is not None and retain_model is not None:
        console.print(
            "[yellow]warning:[/yellow] the --ft-* options are ignored: --target and --retain-model "
            "are given, no model is built"
        )
    return target, retain_model


def _prepare(cfg: TofuConfig):
    """The setup of ``run`` / ``compare`` (models built or given, evaluated, memorisation checked), after every
    check that needs no model work."""
    _given_models(cfg, cfg.train_overrides())
    return tofu_pipeline.prepare(cfg)


def _stage(cfg: TofuConfig, name: str, ctx, rule, folder: Path) -> dict:
    """One method's row through the runner (``folder/{model/, run.json, TOFU_EVAL.json}``)."""
    (row,) = run_method(
        name,
        ctx,
        folder,
        options=cfg.knobs(),
        overrides=cfg.method_overrides(name),
        rule=rule,
        base=cfg.base,
        device=cfg.device,
        resume=cfg.resume,
        method_options=cfg.method_options.get(name),
    )
    return row


def _warn_memorisation(ctx) -> None:
    message = memorisation_warning(ctx.memorisation, hint="--ft-epochs/--ft-lr (tofu finetune: --epochs/--lr)")
    if message:
        console.print(f"warning: {message}", style="bold yellow", markup=False, soft_wrap=True)


def _parallel(cfg: TofuConfig, ctx, chosen: list[str], rule) -> set[str]:
    """``--jobs``: the unfinished method stages in ``cfg.jobs`` processes first; the loop below reuses them (also
    with resume=false: those the jobs just made). The methods whose job succeeded."""
    todo = pending(cfg, ctx, chosen, rule)
    if len(todo) <= 1:
        return set()
    console.print(
        f"running {len(todo)} method stages, {cfg.jobs} at a time, in separate processes",
        markup=False,
        soft_wrap=True,
    )
    status = run_jobs(cfg, todo, cfg.jobs, say=lambda line: console.print(line, markup=False, soft_wrap=True))
    return {m for m, code in status.items() if code == 0}


@dataclass(frozen=True)
class FinetuneSettings:
    """Settings of `tofu finetune` beside its options: the training's (None: the preset's; as ``ft_*`` on ``run`` and
    ``compare``) and the forget share checked."""

    epochs: int | None = opt(None, "Epochs over the split (default: the preset's).")
    lr: float | None = opt(None, "Learning rate (default: the preset's).")
    batch_size: int | None = opt(None, "Micro-batch size (default: the preset's).")
    grad_accum: int | None = opt(None, "Gradient accumulation steps (default: the preset's).")
    max_steps: int | None = opt(
        None, "At most N optimizer steps: a longer run becomes N steps, its schedule fitted to them."
    )
    precision: str | None = opt(
        None, "no, bf16 (autocast, also on CPU) or auto (bf16 on a GPU that has it; default: the preset's)."
    )
    forget_pct: float = opt(
        10, "With --authors and --split full: the forget share (as forgetPP), whose rows' answer NLL is checked."
    )

    def __post_init__(self) -> None:
        self.overrides()

    def overrides(self) -> dict[str, Any]:
        """The training settings as ``finetune`` overrides (a :class:`ConfigError` names a bad one)."""
        return train_overrides(
            "",
            epochs=self.epochs,
            lr=self.lr,
            batch_size=self.batch_size,
            grad_accum=self.grad_accum,
            max_steps=self.max_steps,
            precision=self.precision,
        )


@settings_command(app, FinetuneSettings, [f.name for f in fields(FinetuneSettings)], name="finetune")
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
    settings: dict | None = None,
) -> None:
    """Fine-tune a model on one split (a preset first pretrains its base on a corpus disjoint from TOFU).

    A stopped run resumes from its last saved state when re-run with the same options. On a split with
    forget authors (full, forgetPP) the answer NLL of the forget rows is recorded in train_log.json
    (forget_answer_nll) and a warning printed when it is above the memorisation bound.
    """
    _threads(threads)
    given = FinetuneSettings(**(settings or {}))
    path = build_one(
        preset,
        data,
        split,
        authors,
        out,
        forget_pct=given.forget_pct,
        seed=seed,
        cache_dir=cache_dir,
        device=device,
        overrides=given.overrides(),
    )
    log = json.loads((path / "train_log.json").read_text())
    console.print(
        f"fine-tuned model in [bold]{path}[/bold]; final answer loss {log.get('final_loss', float('nan')):.4f}"
    )
    forget_nll = log.get("forget_answer_nll")
    if forget_nll is not None:
        console.print(
            f"forget rows ({log.get('forget_examples')}): answer NLL {forget_nll:.4f}, probability "
            f"{log.get('forget_prob', float('nan')):.3f} (pretrained "
            f"{_num(log.get('pretrained_forget_prob'))}), greedy ROUGE-L {_num(log.get('forget_rouge'))}"
        )
    check = memorisation(
        preset, log.get("forget_prob"), log.get("forget_rouge"), pretrained_prob=log.get("pretrained_forget_prob")
    )
    message = memorisation_warning(check, what="the model")
    if message:
        console.print(f"warning: {message}", style="bold yellow", markup=False, soft_wrap=True)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


#: `eval`'s settings (KEY=VALUE, --key VALUE or --config; fields of TofuConfig)
EVAL_SETTINGS = ("max_new_tokens", "utility_items", "precision", "threads")


@settings_command(app, TofuConfig, EVAL_SETTINGS, name="eval")
def evaluate(
    model: Annotated[
        Path, typer.Option("--model", "--target", help="Model directory to evaluate (--target is the same option).")
    ],
    out: Annotated[Path, typer.Option(help="Directory for TOFU_EVAL.json, TOFU_SUMMARY.json and TOFU_SUMMARY.md.")],
    data: Data = "synthetic",
    forget_split: ForgetSplit = "forget10",
    authors: Authors = None,
    retain_logs: Annotated[
        Path | None, typer.Option(help="The retain model's TOFU_EVAL.json (for forget quality and privleak).")
    ] = None,
    retain_model: Annotated[
        Path | None,
        typer.Option(
            help="The retain model's folder: evaluated first (cached in its evals/ folder) for forget quality and "
            "privleak; instead of --retain-logs."
        ),
    ] = None,
    metrics: Metrics = None,
    batch_size: Annotated[int, typer.Option(help="Scoring batch size.")] = 16,
    preset: Annotated[
        str,
        typer.Option(help="The preset the model was made with (its memorisation thresholds and default precision)."),
    ] = "model_dir",
    device: Device = "auto",
    settings: dict | None = None,
) -> None:
    """Evaluate a model with the TOFU metric suite (reference definitions and log format); with a retain
    model, the memorisation check of the model too."""
    given = TofuConfig(**(settings or {}))
    _threads(given.threads)
    model = _model_dir(model, "--model")
    groups = _metrics(metrics)
    max_new_tokens, utility_items = given.max_new_tokens, given.utility_items
    precision = given.precision or default_precision(preset, device)
    lean = dict(precision=precision, utility_items=utility_items)
    if retain_model is not None:
        if retain_logs is not None:
            raise typer.BadParameter("give --retain-model or --retain-logs, not both", param_hint="--retain-model")
        retain_model = _model_dir(retain_model, "--retain-model")
        retain_logs = tofu_pipeline.cached_eval(
            retain_model,
            data,
            forget_split,
            authors,
            max_new_tokens,
            device,
            metrics=tofu_pipeline.reference_metrics(groups),
            fingerprint=tofu_pipeline.model_fingerprint(retain_model),
            **lean,
        )
    adapter = TextLLMAdapter.from_pretrained(model, device=device, precision=precision)
    logs = evaluate_tofu(
        adapter,
        data,
        forget_split,
        authors,
        retain_logs=retain_logs,
        out_dir=out,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        model_name=Path(model).name,
        metrics=groups,
        utility_items=utility_items,
    )
    console.print(summary_table(logs))
    if retain_logs is not None and "forget_Q_A_Prob" in logs:
        retain = json.loads(Path(retain_logs).read_text()) if Path(retain_logs).is_file() else {}
        check = memorisation(
            preset,
            logs["forget_Q_A_Prob"]["agg_value"],
            (logs.get("forget_Q_A_ROUGE") or {}).get("agg_value"),
            retain_prob=(retain.get("forget_Q_A_Prob") or {}).get("agg_value"),
            forget_quality=(logs.get("forget_quality") or {}).get("agg_value"),
        )
        write_text_atomic(Path(out) / "MEMORISATION.json", json.dumps(check, indent=2))
        message = memorisation_warning(check, what="the model")
        console.print(
            f"warning: {message}" if message else f"memorised the forget answers: {check['memorised']}",
            markup=False,
            soft_wrap=True,
        )


@config_command(app, TofuConfig, name="run", exclude=RUN_EXCLUDES, benchmark="tofu")
def run(cfg: TofuConfig) -> None:
    """Unlearn the forget split from the target model with one method, then evaluate it: OUT/model (`mmunlearn
    restore --model OUT/model` undoes it), OUT/TOFU_EVAL.json, OUT/run.json."""
    require(cfg, "method", "out")
    _threads(cfg.threads)
    ctx = _prepare(cfg)
    _warn_memorisation(ctx)
    row = _stage(
        cfg, cfg.method, ctx, sweep_rule(ctx.forget_target() if cfg.sweep else None, cfg.retain_bound), cfg.out
    )
    console.print(tofu_report.markdown([ctx.reference_row("target"), row, ctx.reference_row("retain")]))
    _warn_memorisation(ctx)  # again below the table, where it is seen


@config_command(
    app,
    TofuConfig,
    name="compare",
    exclude=COMPARE_EXCLUDES,
    defaults=dict(out=Path("runs/tofu_compare"), preset="mini", sweep=True),
    benchmark="tofu",
)
def compare(cfg: TofuConfig) -> None:
    """Run every method on the same target model and split; one table and a scatter plot (and, with
    --audit, the robustness audit table AUDIT.md). With --rehearse the config runs at the smallest size on the CPU
    first (recipes/rehearsal.py)."""
    cfg = rehearsal_of(cfg, "tofu", say=lambda line: console.print(line, markup=False, soft_wrap=True))
    _threads(cfg.threads)
    chosen, out = cfg.chosen(), cfg.out
    audit_opts = cfg.audit_options() if cfg.audit else None
    start = time.perf_counter()
    stages = Stages(len(chosen) + 1, start, say=lambda line: console.print(line, markup=False, soft_wrap=True))
    ctx = _prepare(cfg)
    stages.done("target and retain models, their evaluations", time.perf_counter() - start, setup=True)
    _warn_memorisation(ctx)
    refs = [ctx.reference_row("target"), ctx.reference_row("retain")]
    # rows of methods not run now are kept from an earlier comparison of the same context
    context = {
        **ctx.describe(),
        **cfg.knobs(),
        "host": host_precision(cfg.device, ctx),
        **({"method_options": cfg.method_options} if cfg.method_options else {}),
    }
    kept = tofu_report.earlier_rows(out, context, exclude=chosen)
    target_nll = ctx.forget_target() if cfg.sweep else None
    rule = sweep_rule(target_nll, cfg.retain_bound)
    made = _parallel(cfg, ctx, chosen, rule) if cfg.jobs > 1 else set()
    audit_cache, earlier_audits = {}, tofu_pipeline.earlier_audits(out, [r["method"] for r in kept])
    got, _ = run_comparison(
        Comparison(
            chosen,
            rows=lambda name: [_stage(replace(cfg, resume=True) if name in made else cfg, name, ctx, rule, out / name)],
            write=lambda done: tofu_report.write_tables(
                out, tofu_report.ordered(refs + done + kept), {**context, "timing": stages.timing(ctx.built)}
            ),
            audit=None
            if audit_opts is None
            else lambda name: tofu_pipeline.audit_method(name, ctx, out / name, audit_opts, cfg.device, audit_cache),
            write_audit=lambda audits: tofu_report.write_audit_table(out, audits + earlier_audits, context),
        ),
        stages,
        budget=cfg.budget_seconds(),
        keep_going=cfg.keep_going,
    )
    rows = tofu_report.ordered(refs + got + kept)
    tofu_report.scatter(out / "fq_vs_mu.png", rows)
    if cfg.sweep:
        tofu_report.selectivity_plot(out / "selectivity.png", out, [r["method"] for r in rows], target_nll)
    console.print(tofu_report.markdown(rows))
    if audit_opts is not None:
        console.print((out / "AUDIT.md").read_text(), markup=False, soft_wrap=True)
    _warn_memorisation(ctx)  # again below the table, where it is seen
    total = time.perf_counter() - start
    tofu_report.write_tables(out, rows, {**context, "wall_seconds": total, "timing": stages.timing(ctx.built)})
    console.print(
        f"wrote {out}/compare.md, .csv, .json and fq_vs_mu.png"
        + (" and AUDIT.md / AUDIT.json" if audit_opts is not None else "")
        + f"; the whole command took {total:.0f} s ({total / 60:.1f} min)"
    )


@app.command()
def tilt(
    model: Annotated[Path, typer.Option(help="Model directory (frozen base).")],
    retain: Annotated[
        Path,
        typer.Option(
            help="Retain rows: a JSON, JSONL or CSV of question-answer rows, or a .txt of texts (docs/usage.md, "
            "'Accepted data formats')."
        ),
    ],
    forget: Annotated[
        Path,
        typer.Option(
            help="Forget rows, in the same formats as --retain (this very file is read; a row in both is refused)."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Directory for the tilt head and its settings.")],
    rank: Annotated[int, typer.Option(help="Head rank h.")] = 20,
    temperature: Annotated[float, typer.Option(help="Temperature T >= 1 stored with the head.")] = 1.0,
    epochs: Annotated[int, typer.Option(help="Full-batch epochs over the cached states.")] = 100,
    lr: Annotated[float, typer.Option(help="Head learning rate.")] = 1e-2,
    spare_seen: Annotated[
        bool,
        typer.Option(
            help="T3's default for a model folder: the head is trained on the answer tokens not already in the text "
            "and leaves those (a copy of the question's words or of the answer so far) untouched when decoding; "
            "--no-spare-seen: the plain tilt, every token."
        ),
    ] = True,
    cache_dir: CacheDir = None,
    device: Device = "auto",
) -> None:
    """Train a T3 tilt head for any model directory and QA files: a serving-time filter (the base's weights, which
    still hold the forget set, are not changed)."""
    from mmunlearn.tilt import TiltedCausalLM  # deferred: tilt imports transformers, kept out of CLI start
    from mmunlearn.tilt.train import train_tilt  # deferred: tilt imports transformers, kept out of CLI start

    adapter = TextLLMAdapter.from_pretrained(model, device=device)
    r_items, f_items = read_text_rows(retain, "retain"), read_text_rows(forget, "forget")  # the files named, as given
    shared = overlap(f_items, r_items)
    if shared:
        raise typer.BadParameter(
            f"{len(shared)} forget row(s) are also retain rows (e.g. {shared[0]['question']!r:.80})",
            param_hint="--forget",
        )
    cache = cache_dir or (out.parent / ".tilt_cache")
    fit = train_tilt(
        adapter, r_items, f_items, rank=rank, epochs=epochs, lr=lr, cache_dir=cache, unseen_only=spare_seen
    )
    tilted = TiltedCausalLM(adapter.model, fit.head, temperature, spare_seen=spare_seen)
    tilted.save(out)  # a head alone: no path to the base recorded
    console.print(fit.summary())
    console.print(
        f"tilt head written to [bold]{out}[/bold]; load it with TiltedCausalLM.load({str(out)!r}, "
        f"base=<the model of {model}>). A serving-time filter: {model}'s weights still hold the forget set."
    )


configs_command(app, "tofu")  # `mmunlearn tofu configs`: the shipped configs (recipes/configs/tofu/)
