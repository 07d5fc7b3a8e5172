"""Cross-lingual TOFU recipe (``mmunlearn ctofu ...``): forget in one language, measure in every language.

``finetune`` builds the target (every language's retain + forget rows) and the retain model (retain
rows only) after checking that the translations are row-aligned with English and that the models are
trained on the very question/answer text the metrics score (``alignment.md``; a mismatch stops the
run unless ``--allow-text-mismatch``); ``run`` unlearns the forget rows of ``--forget-lang`` with
one method and evaluates the TOFU metrics per language;
``compare`` does that for every method and writes the method x language tables, the forget-quality
heatmap, the per-language forget ROUGE-L drop and the transfer summary (Markdown + JSON).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from recipes import ctofu_pipeline, ctofu_report, tofu_report
from recipes.tofu import (AuditAttacks, AuditFlag, AuditLr, AuditOn, AuditSteps, Base, CacheDir, Device, Preset,
                          RetainBound, Seed, Threads, _audit_options)
from recipes.tofu_settings import sweep_rule

app = typer.Typer(help="Cross-lingual TOFU: fine-tune on every language, forget in one, measure in all.",
                  no_args_is_help=True)
console = Console()

Data = Annotated[str, typer.Option(help="Folder of <split>_<lang>.json files (e.g. shared/data/ctofu), or 'synthetic[:retain_authors=8,langs=en/fr/ar]' (built-in stand-in).")]
English = Annotated[Optional[Path], typer.Option(help="TOFU folder for English (default: <split>_en.json files, or a 'tofu' folder beside --data).")]
Langs = Annotated[str, typer.Option(help="Languages the models are trained on: 'all' (discovered from the files) or e.g. en,fr,ar.")]
Authors = Annotated[Optional[int], typer.Option(help="Keep the first N retain authors of every language (all forget authors are kept).")]
Facts = Annotated[Optional[int], typer.Option(help="Keep the first K real-authors and K world-facts rows per language (training replay and utility).")]
ForgetLang = Annotated[str, typer.Option(help="Language(s) whose forget rows are unlearned, e.g. en or en,fr.")]
EvalLangs = Annotated[str, typer.Option(help="Languages to evaluate in: 'all' (the trained ones) or e.g. en,fr,ar.")]
RetainLangs = Annotated[str, typer.Option(help="Retain rows the methods may use: 'forget' (same languages as the forget rows), 'all', or a list.")]
SkipMisaligned = Annotated[bool, typer.Option(help="Drop languages whose files are not row-aligned with English (default: stop with the report).")]
TrainText = Annotated[str, typer.Option(help="Question/answer text the models are trained on: 'scored' (each scored row's text from the file the metrics score, forget01_perturbed / retain_perturbed; default) or 'files' (forget01 / retain99 as shipped, as before issue 16; on the shipped translations that differs from the scored text and needs --allow-text-mismatch).")]
AllowTextMismatch = Annotated[bool, typer.Option(help="Go on when the trained question/answer text differs from the scored one (recorded in alignment.md; the forget metrics then partly measure paraphrase robustness). Default: stop with the counts.")]
MaxNew = Annotated[int, typer.Option(help="Greedy generation length for ROUGE (the reference uses 200).")]


def _world(data: str, english: Path | None, langs: str, authors: int | None, facts: int | None,
           skip_misaligned: bool, out: Path, train_text: str = "scored", allow_text_mismatch: bool = False):
    """The run's world, after the alignment check and the trained-vs-scored text check (report written
    to ``out``; alignment errors stop or drop languages, a text mismatch stops or is recorded)."""
    from mmunlearn.data.ctofu import (FACT_SPLITS, FORGET_SPLIT, TRAIN_TEXTS, build_world, open_ctofu, parse_langs,
                                      retain_split_for)
    from mmunlearn.data.ctofu_align import check_alignment

    if train_text not in TRAIN_TEXTS:
        raise typer.BadParameter(f"{train_text!r}; choose from {', '.join(TRAIN_TEXTS)}", param_hint="--train-text")
    ct = open_ctofu(data, english)
    chosen = parse_langs(langs, ct.languages)
    required = (FORGET_SPLIT, f"{FORGET_SPLIT}_perturbed", retain_split_for(FORGET_SPLIT), "retain_perturbed")
    report = check_alignment(ct, chosen, (*required, *FACT_SPLITS), required=required)
    report.write(out)
    n_suspect = len(report.suspects)
    console.print(f"cTOFU data: {ct.description}; languages {', '.join(chosen)}; alignment: "
                  f"{len(report.errors)} error(s), {n_suspect} suspect row(s) (see {out}/alignment.md)")
    if report.errors:
        console.print(report.markdown(max_rows=10))
        bad = report.bad_languages()
        if not skip_misaligned or "*" in bad:
            raise typer.BadParameter(f"languages {bad} are not row-aligned with English; fix the files or pass "
                                     f"--skip-misaligned to leave them out", param_hint="--data")
        chosen = tuple(lang for lang in chosen if lang not in bad)
        console.print(f"[yellow]left out (misaligned): {', '.join(bad)}[/yellow]")
    world = build_world(ct, chosen, authors=authors, facts=facts, train_text=train_text)
    differ = report.add_text_agreement(world, allowed=allow_text_mismatch)
    report.write(out)
    shared = sum(t.shared for t in report.texts)
    console.print(f"trained vs scored text: {shared} of {sum(t.scored for t in report.texts)} scored rows identical "
                  f"(train text: {train_text})")
    if differ:
        counts = "; ".join(f"{t.lang} {t.split}: {t.shared}/{t.scored}" for t in differ)
        if not allow_text_mismatch:
            raise typer.BadParameter(
                f"the models would be trained on other question/answer text than the metrics score ({counts} "
                f"scored rows identical; see {out}/alignment.md); train on the scored text (--train-text scored) "
                f"or pass --allow-text-mismatch to record it and go on", param_hint="--train-text")
        console.print(f"[yellow]trained text differs from scored text ({counts}); going on as "
                      f"--allow-text-mismatch asks[/yellow]")
    return world


def _langs(spec: str, world, default: tuple[str, ...]) -> tuple[str, ...]:
    from mmunlearn.data.ctofu import parse_langs

    return default if spec == "forget" else parse_langs(spec, world.languages)


def _context(data, english, langs, authors, facts, skip_misaligned, out, preset, forget_lang, eval_langs,
             retain_langs, seed, cache_dir, device, max_new_tokens, train_text, allow_text_mismatch):
    from mmunlearn.data.ctofu import parse_langs

    world = _world(data, english, langs, authors, facts, skip_misaligned, out, train_text, allow_text_mismatch)
    forget = parse_langs(forget_lang, world.languages)
    return ctofu_pipeline.prepare(preset, world, forget, parse_langs(eval_langs, world.languages),
                                  _langs(retain_langs, world, forget), seed, cache_dir, device, max_new_tokens)


@app.command()
def finetune(
    out: Annotated[Path, typer.Option(help="Directory for models.json (paths and train logs) and the alignment report.")] = Path("runs/ctofu_models"),
    data: Data = "synthetic",
    english: English = None,
    langs: Langs = "all",
    authors: Authors = None,
    facts: Facts = None,
    preset: Preset = "micro",
    skip_misaligned: SkipMisaligned = False,
    train_text: TrainText = "scored",
    allow_text_mismatch: AllowTextMismatch = False,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Target model on retain + forget of every language, retain model on the retain rows (cached)."""
    from mmunlearn.metrics.logs import write_json_atomic
    from mmunlearn.presets.build import torch_threads

    with torch_threads(threads):
        world = _world(data, english, langs, authors, facts, skip_misaligned, out, train_text, allow_text_mismatch)
        built = ctofu_pipeline.build(preset, world, seed, cache_dir, device)
    write_json_atomic(out / "models.json", {"world": world.describe(), "base": str(built.base),
                                            "target": str(built.target), "retain": str(built.retain),
                                            "logs": built.logs})
    for role in ("target", "retain"):
        log = built.logs[role]
        console.print(f"{role}: [bold]{getattr(built, role)}[/bold] ({log.get('n_examples')} QA, answer NLL "
                      f"{log.get('answer_nll', float('nan')):.4f})")


@app.command()
def run(
    method: Annotated[str, typer.Option(help="A method of `mmunlearn methods` (qr-erase, svd-unlearn, grad_diff, t3, rmu, ...).")],
    out: Annotated[Path, typer.Option(help="Output directory: run.md/.json, one folder of TOFU logs per language, the model.")],
    forget_lang: ForgetLang = "en",
    eval_langs: EvalLangs = "all",
    retain_langs: RetainLangs = "forget",
    data: Data = "synthetic",
    english: English = None,
    langs: Langs = "all",
    authors: Authors = None,
    facts: Facts = None,
    preset: Preset = "micro",
    skip_misaligned: SkipMisaligned = False,
    train_text: TrainText = "scored",
    allow_text_mismatch: AllowTextMismatch = False,
    base: Base = "target",
    sweep: Annotated[bool, typer.Option(help="Pick rank/scale (erasure), temperature (T3) and baseline epochs on the training partitions.")] = False,
    retain_bound: RetainBound = 0.1,
    rank: Annotated[Optional[int], typer.Option(help="Erasure: forget rank k.")] = None,
    scale: Annotated[Optional[float], typer.Option(help="Erasure: W' = W - scale * T~.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="T3 temperature T >= 1.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Baselines: learning rate.")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Baselines: epochs over the forget set.")] = None,
    max_new_tokens: MaxNew = 200,
    seed: Seed = 0,
    device: Device = "auto",
    cache_dir: CacheDir = None,
    threads: Threads = None,
) -> None:
    """Unlearn the forget rows of --forget-lang with one method; TOFU metrics in every --eval-langs language."""
    from mmunlearn.presets.build import torch_threads

    with torch_threads(threads):
        ctx = _context(data, english, langs, authors, facts, skip_misaligned, out, preset, forget_lang, eval_langs,
                       retain_langs, seed, cache_dir, device, max_new_tokens, train_text, allow_text_mismatch)
        options = dict(rank=rank, scale=scale, temperature=temperature, lr=lr, epochs=epochs)
        rule = sweep_rule(ctx.forget_target() if sweep else None, retain_bound)
        mine = ctofu_pipeline.run_method_rows(method, ctx, options, rule, base, out / method, device)
        rows = [*ctx.reference_rows("target"), *mine, *ctx.reference_rows("retain")]
    summary = ctofu_pipeline.transfer_summary(rows, ctx.forget_langs)
    ctofu_report.write_report(out, "run", rows, summary, ctx.forget_langs, ctx.describe())
    console.print(ctofu_report.long_table(rows))
    console.print(ctofu_report.transfer_table(summary))


@app.command()
def compare(
    out: Annotated[Path, typer.Option(help="Output directory: compare.md/.json, fq_heatmap.png, rouge_drop.png, one folder per method.")] = Path("runs/ctofu_compare"),
    methods: Annotated[str, typer.Option(help="Comma-separated methods, or 'all'.")] = "all",
    forget_lang: ForgetLang = "en",
    eval_langs: EvalLangs = "all",
    retain_langs: RetainLangs = "forget",
    data: Data = "synthetic",
    english: English = None,
    langs: Langs = "all",
    authors: Authors = None,
    facts: Facts = None,
    preset: Preset = "mini",
    skip_misaligned: SkipMisaligned = False,
    train_text: TrainText = "scored",
    allow_text_mismatch: AllowTextMismatch = False,
    base: Base = "target",
    sweep: Annotated[bool, typer.Option(help="Pick each method's rank/scale/temperature/epochs on the training partitions.")] = True,
    retain_bound: RetainBound = 0.1,
    max_new_tokens: MaxNew = 200,
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
    """Every method on the same target: method x language tables, heatmaps and the transfer summary (and, with
    --audit, the robustness audit table AUDIT.md with the forgetting kept in every language)."""
    from mmunlearn.presets.build import torch_threads
    from mmunlearn.methods import names

    known = names("text")
    chosen = known if methods == "all" else [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise typer.BadParameter(f"unknown methods {unknown}; choose from {known}", param_hint="--methods")
    audit_opts = _audit_options(preset, audit_relearn_steps, audit_relearn_lr, audit_relearn_on, audit_attacks,
                                max_new_tokens) if audit else None
    start = time.perf_counter()
    audits, audit_cache = [], {}
    with torch_threads(threads):
        ctx = _context(data, english, langs, authors, facts, skip_misaligned, out, preset, forget_lang, eval_langs,
                       retain_langs, seed, cache_dir, device, max_new_tokens, train_text, allow_text_mismatch)
        refs = [*ctx.reference_rows("target"), *ctx.reference_rows("retain")]
        target_nll = ctx.forget_target() if sweep else None
        rows: list[dict] = []
        for name in chosen:
            rows += ctofu_pipeline.run_method_rows(name, ctx, {}, sweep_rule(target_nll, retain_bound), base,
                                                   out / name, device)
            summary = ctofu_pipeline.transfer_summary(rows, ctx.forget_langs)  # after each method: nothing lost
            ctofu_report.write_report(out, "compare", refs + rows, summary, ctx.forget_langs,
                                      {**ctx.describe(), "seconds": time.perf_counter() - start})
            if audit_opts is not None:
                console.print(f"auditing {name} ...")
                audits.append(ctofu_pipeline.audit_method(name, ctx, out / name, audit_opts, device, audit_cache))
                tofu_report.write_audit_table(out, audits, ctx.describe())
    everything = refs + rows
    ctofu_report.heatmap(out / "fq_heatmap.png", everything, "forget_quality",
                         f"Forget quality per language (forget data: {', '.join(ctx.forget_langs)})", log10=True)
    ctofu_report.heatmap(out / "rouge_drop.png", everything, "rouge_drop",
                         "Forget ROUGE-L drop vs the target model, per language", cmap="magma")
    console.print(ctofu_report.matrix(everything, "forget_quality"))
    console.print(ctofu_report.transfer_table(ctofu_pipeline.transfer_summary(rows, ctx.forget_langs)))
    if audit_opts is not None:
        console.print((out / "AUDIT.md").read_text(), markup=False, soft_wrap=True)
    console.print(f"wrote {out}/compare.md, compare.json, fq_heatmap.png and rouge_drop.png"
                  + (" and AUDIT.md / AUDIT.json" if audit_opts is not None else "")
                  + f" in {time.perf_counter() - start:.0f} s")
