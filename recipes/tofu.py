"""TOFU recipe (``mmunlearn tofu ...``): target/retain models, evaluation, unlearning, comparison.

Read top to bottom: ``finetune`` and ``eval`` are the harness; ``run`` unlearns with one method
and evaluates; ``compare`` runs every method on the same target and split and writes one table
(Markdown, CSV, JSON) and a scatter plot; ``tilt`` trains a T3 head for any model and data files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from recipes import tofu_pipeline, tofu_report
from recipes.tofu_settings import sweep_rule

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
Threads = Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice; 1 is faster on a busy 2-core machine).")]


def _threads(n: int | None) -> None:
    from mmunlearn.errors import set_threads

    set_threads(n)


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
) -> None:
    """Fine-tune a model on one split (a preset first pretrains its base on a corpus disjoint from TOFU)."""
    from mmunlearn.presets.build import finetune as build_one

    _threads(threads)
    path = build_one(preset, data, split, authors, out, seed=seed, cache_dir=cache_dir, device=device)
    log = json.loads((path / "train_log.json").read_text())
    console.print(f"fine-tuned model in [bold]{path}[/bold]; final answer loss {log.get('final_loss', float('nan')):.4f}")


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="Model directory to evaluate.")],
    out: Annotated[Path, typer.Option(help="Directory for TOFU_EVAL.json, TOFU_SUMMARY.json and TOFU_SUMMARY.md.")],
    data: Data = "synthetic",
    forget_split: ForgetSplit = "forget10",
    authors: Authors = None,
    retain_logs: Annotated[Optional[Path], typer.Option(help="The retain model's TOFU_EVAL.json (for forget quality and privleak).")] = None,
    batch_size: Annotated[int, typer.Option(help="Scoring batch size.")] = 16,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy generation length for ROUGE (the reference uses 200).")] = 200,
    device: Device = "auto",
    threads: Threads = None,
) -> None:
    """Evaluate a model with the full TOFU metric suite (reference definitions and log format)."""
    from mmunlearn.adapters.text_llm import TextLLMAdapter
    from mmunlearn.eval import evaluate_tofu, summary_table

    _threads(threads)
    adapter = TextLLMAdapter.from_pretrained(model, device=device)
    logs = evaluate_tofu(adapter, data, forget_split, authors, retain_logs=retain_logs, out_dir=out,
                         batch_size=batch_size, max_new_tokens=max_new_tokens, model_name=Path(model).name)
    console.print(summary_table(logs))


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
    extract: Annotated[Optional[str], typer.Option(help="Erasure task vectors: finetune, lora or gradient.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="T3 temperature T >= 1.")] = None,
    t3_rank: Annotated[Optional[int], typer.Option("--t3-rank", help="T3 head rank h.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Baselines: learning rate.")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Baselines: epochs over the forget set.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Greedy generation length for ROUGE.")] = 200,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Unlearn the forget split from the target model with one method, then evaluate it."""
    _threads(threads)
    ctx = tofu_pipeline.prepare(preset, data, forget_split, authors, seed, cache_dir, device, max_new_tokens)
    options = dict(rank=rank, scale=scale, extract_kind=extract, temperature=temperature, head_rank=t3_rank, lr=lr,
                   epochs=epochs)
    rule = sweep_rule(ctx.forget_target() if sweep else None, retain_bound)
    row = tofu_pipeline.run_method_row(method, ctx, options, rule, base, out, device)
    console.print(tofu_report.markdown([ctx.reference_row("target"), row, ctx.reference_row("retain")]))


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
    max_new_tokens: Annotated[int, typer.Option(help="Greedy generation length for ROUGE.")] = 200,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Run every method on the same target model and split; one table and a scatter plot."""
    from mmunlearn.methods import names

    _threads(threads)
    known = names("text")
    chosen = known if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise typer.BadParameter(f"unknown methods {unknown}; choose from {known}")
    start = time.perf_counter()
    ctx = tofu_pipeline.prepare(preset, data, forget_split, authors, seed, cache_dir, device, max_new_tokens)
    rows = [ctx.reference_row("target"), ctx.reference_row("retain")]
    # rows of methods not run now are kept from an earlier comparison of the same context
    kept = tofu_report.earlier_rows(out, ctx.describe(), exclude=chosen)
    target_nll = ctx.forget_target() if sweep else None
    for name in chosen:
        rows.append(tofu_pipeline.run_method_row(name, ctx, {}, sweep_rule(target_nll, retain_bound), base,
                                                 out / name, device))
        tofu_report.write_tables(out, tofu_report.ordered(rows + kept), ctx.describe())  # nothing lost if interrupted
    rows = tofu_report.ordered(rows + kept)
    tofu_report.scatter(out / "fq_vs_mu.png", rows)
    if sweep:
        tofu_report.selectivity_plot(out / "selectivity.png", out, [r["method"] for r in rows], target_nll)
    console.print(tofu_report.markdown(rows))
    console.print(f"wrote {out}/compare.md, .csv, .json and fq_vs_mu.png in {time.perf_counter() - start:.0f} s")


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
