"""Cross-lingual TOFU recipe (``mmunlearn ctofu ...``): forget in one language, measure in every language.

``finetune`` builds the target (every language's retain + forget rows) and the retain model (retain
rows only) after checking that the translations are row-aligned with English and that the models are
trained on the very question/answer text the metrics score (``alignment.md``; a mismatch stops the
run unless ``--allow-text-mismatch``); ``run`` unlearns the forget rows of ``--forget-lang`` with
one method and evaluates the TOFU metrics per language;
``compare`` does that for every method and writes the method x language tables, the forget-quality
heatmap, the per-language forget ROUGE-L drop, the forget-probability ratio after / before (the transfer matrix,
``prob_ratio.png``) and the transfer summary (Markdown + JSON).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mmunlearn.config.command import settings_command
from mmunlearn.data.ctofu.align import check_alignment
from mmunlearn.data.ctofu.worlds import (
    FACT_SPLITS,
    FORGET_SPLIT,
    TRAIN_TEXTS,
    build_world,
    open_ctofu,
    parse_langs,
    retain_split_for,
)
from mmunlearn.metrics.logs import write_json_atomic
from mmunlearn.presets.build import torch_threads
from recipes.ctofu import pipeline as ctofu_pipeline
from recipes.ctofu import report as ctofu_report
from recipes.ctofu.config import CTofuConfig
from recipes.recipe_cli import config_command, configs_command, help_of, require
from recipes.rehearsal import host_precision, rehearsal_of
from recipes.runner import Comparison, Stages, run_comparison, run_method
from recipes.tofu import report as tofu_report
from recipes.tofu.config import COMPARE_EXCLUDES, RUN_EXCLUDES
from recipes.tofu.parallel import pending, run_jobs
from recipes.tofu.settings import memorisation_warning, sweep_rule

app = typer.Typer(
    help="Cross-lingual TOFU: fine-tune on every language, forget in one, measure in all.", no_args_is_help=True
)
console = Console()


def _option(key: str, tp=str):
    """The ``finetune`` option of a config field (help declared once, in :class:`CTofuConfig`)."""
    return Annotated[tp, typer.Option(help=help_of(CTofuConfig, key))]


Data, English, Langs = _option("data"), _option("english", Path | None), _option("langs")
Authors, Preset = _option("authors", int | None), _option("preset")
Seed, Device = _option("seed", int), _option("device")
#: `finetune`'s settings (KEY=VALUE, --key VALUE or --config; fields of CTofuConfig)
FINETUNE_SETTINGS = ("facts", "skip_misaligned", "train_text", "allow_text_mismatch", "cache_dir", "threads")


def _world(
    data: str,
    english: Path | None,
    langs: str,
    authors: int | None,
    facts: int | None,
    skip_misaligned: bool,
    out: Path,
    train_text: str = "scored",
    allow_text_mismatch: bool = False,
):
    """The run's world, after the alignment check and the trained-vs-scored text check (report written
    to ``out``; alignment errors stop or drop languages, a text mismatch stops or is recorded)."""
    if train_text not in TRAIN_TEXTS:
        raise typer.BadParameter(f"{train_text!r}; choose from {', '.join(TRAIN_TEXTS)}", param_hint="--train-text")
    ct = open_ctofu(data, english)
    chosen = parse_langs(langs, ct.languages)
    required = (FORGET_SPLIT, f"{FORGET_SPLIT}_perturbed", retain_split_for(FORGET_SPLIT), "retain_perturbed")
    report = check_alignment(ct, chosen, (*required, *FACT_SPLITS), required=required)
    report.write(out)
    n_suspect = len(report.suspects)
    console.print(
        f"cTOFU data: {ct.description}; languages {', '.join(chosen)}; alignment: "
        f"{len(report.errors)} error(s), {n_suspect} suspect row(s) (see {out}/alignment.md)"
    )
    if report.errors:
        console.print(report.markdown(max_rows=10))
        bad = report.bad_languages()
        if not skip_misaligned or "*" in bad:
            raise typer.BadParameter(
                f"languages {bad} are not row-aligned with English; fix the files or pass "
                f"--skip-misaligned to leave them out",
                param_hint="--data",
            )
        chosen = tuple(lang for lang in chosen if lang not in bad)
        console.print(f"[yellow]left out (misaligned): {', '.join(bad)}[/yellow]")
    world = build_world(ct, chosen, authors=authors, facts=facts, train_text=train_text)
    differ = report.add_text_agreement(world, allowed=allow_text_mismatch)
    report.write(out)
    shared = sum(t.shared for t in report.texts)
    console.print(
        f"trained vs scored text: {shared} of {sum(t.scored for t in report.texts)} scored rows identical "
        f"(train text: {train_text})"
    )
    if differ:
        counts = "; ".join(f"{t.lang} {t.split}: {t.shared}/{t.scored}" for t in differ)
        if not allow_text_mismatch:
            raise typer.BadParameter(
                f"the models would be trained on other question/answer text than the metrics score ({counts} "
                f"scored rows identical; see {out}/alignment.md); train on the scored text (--train-text scored) "
                f"or pass --allow-text-mismatch to record it and go on",
                param_hint="--train-text",
            )
        console.print(
            f"[yellow]trained text differs from scored text ({counts}); going on as --allow-text-mismatch asks[/yellow]"
        )
    return world


def _langs(spec: str, world, default: tuple[str, ...]) -> tuple[str, ...]:
    return default if spec == "forget" else parse_langs(spec, world.languages)


def _context(cfg: CTofuConfig):
    world = _world(
        cfg.data,
        cfg.english,
        cfg.langs,
        cfg.authors,
        cfg.facts,
        cfg.skip_misaligned,
        cfg.out,
        cfg.train_text,
        cfg.allow_text_mismatch,
    )
    forget = parse_langs(cfg.forget_lang, world.languages)
    return ctofu_pipeline.prepare(
        cfg.preset,
        world,
        forget,
        parse_langs(cfg.eval_langs, world.languages),
        _langs(cfg.retain_langs, world, forget),
        cfg.seed,
        cfg.cache_dir,
        cfg.device,
        cfg.max_new_tokens,
        build_options=cfg.build_options(),
        score_batch=cfg.score_batch,
        gen_batch=cfg.gen_batch,
    )


def _rows(cfg: CTofuConfig, name: str, ctx, rule, folder: Path) -> list[dict]:
    """One method's rows (one per evaluation language) through the runner: ``folder/{model/, run.json, <lang>/}``."""
    return run_method(
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


def _parallel(cfg: CTofuConfig, ctx, chosen: list[str], rule) -> set[str]:
    """``jobs``: the unfinished method stages in ``cfg.jobs`` ``ctofu run`` processes first (each writes
    ``OUT/<method>/`` as the comparison does, with the same stage key); the comparison then reuses them (also with
    resume=false: those the jobs just made). The methods whose job succeeded."""
    todo = pending(cfg, ctx, chosen, rule)
    if len(todo) <= 1:
        return set()
    say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731
    say(f"running {len(todo)} method stages, {cfg.jobs} at a time, in separate processes")
    return {m for m, code in run_jobs(cfg, todo, cfg.jobs, say=say, benchmark="ctofu").items() if code == 0}


@settings_command(app, CTofuConfig, FINETUNE_SETTINGS, name="finetune")
def finetune(
    out: Annotated[
        Path, typer.Option(help="Directory for models.json (paths and train logs) and the alignment report.")
    ] = Path("runs/ctofu_models"),
    data: Data = "synthetic",
    english: English = None,
    langs: Langs = "all",
    authors: Authors = None,
    preset: Preset = "micro",
    seed: Seed = 0,
    device: Device = "auto",
    settings: dict | None = None,
) -> None:
    """Target model on retain + forget of every language, retain model on the retain rows (cached)."""
    given = CTofuConfig(**(settings or {}))
    with torch_threads(given.threads):
        world = _world(
            data,
            english,
            langs,
            authors,
            given.facts,
            given.skip_misaligned,
            out,
            given.train_text,
            given.allow_text_mismatch,
        )
        built = ctofu_pipeline.build(preset, world, seed, given.cache_dir, device)
    write_json_atomic(
        out / "models.json",
        {
            "world": world.describe(),
            "base": str(built.base),
            "target": str(built.target),
            "retain": str(built.retain),
            "logs": built.logs,
        },
    )
    for role in ("target", "retain"):
        log = built.logs[role]
        console.print(
            f"{role}: [bold]{getattr(built, role)}[/bold] ({log.get('n_examples')} QA, answer NLL "
            f"{log.get('answer_nll', float('nan')):.4f})"
        )


@config_command(app, CTofuConfig, name="run", exclude=RUN_EXCLUDES, benchmark="ctofu", options=("langs",))
def run(cfg: CTofuConfig) -> None:
    """Unlearn the forget rows of --forget-lang with one method; TOFU metrics in every --eval-langs language
    (OUT/{model/, run.json, <lang>/}, as one method's folder of `compare`; the tables in OUT/summary.md/.json)."""
    require(cfg, "method", "out")
    with torch_threads(cfg.threads):
        ctx = _context(cfg)
        rule = sweep_rule(ctx.forget_target() if cfg.sweep else None, cfg.retain_bound)
        mine = _rows(cfg, cfg.method, ctx, rule, cfg.out)
        rows = [*ctx.reference_rows("target"), *mine, *ctx.reference_rows("retain")]
    summary = ctofu_pipeline.transfer_summary(rows, ctx.forget_langs)
    ctofu_report.write_report(cfg.out, "summary", rows, summary, ctx.forget_langs, ctx.describe())
    console.print(ctofu_report.long_table(rows))
    console.print(ctofu_report.transfer_table(summary))


@config_command(
    app,
    CTofuConfig,
    name="compare",
    exclude=COMPARE_EXCLUDES,
    defaults=dict(out=Path("runs/ctofu_compare"), preset="mini", sweep=True),
    benchmark="ctofu",
    options=("langs",),
)
def compare(cfg: CTofuConfig) -> None:
    """Every method on the same target: method x language tables, heatmaps and the transfer summary (and, with
    --audit, the robustness audit table AUDIT.md with the forgetting kept in every language). With --rehearse the
    config runs at the smallest size on the CPU first (recipes/rehearsal.py)."""
    cfg = rehearsal_of(cfg, "ctofu", say=lambda line: console.print(line, markup=False, soft_wrap=True))
    chosen, out = cfg.chosen(), cfg.out
    audit_opts = cfg.audit_options() if cfg.audit else None
    start = time.perf_counter()
    audit_cache = {}
    stages = Stages(len(chosen) + 1, start, say=lambda line: console.print(line, markup=False, soft_wrap=True))
    with torch_threads(cfg.threads):
        ctx = _context(cfg)
        refs = [*ctx.reference_rows("target"), *ctx.reference_rows("retain")]
        target_nll = ctx.forget_target() if cfg.sweep else None
        memorised = ctx.memorisation()
        for lang, check in memorised.items():
            if check["memorised"] is False:
                console.print(
                    f"warning ({lang}): {memorisation_warning(check)}",
                    style="bold yellow",
                    markup=False,
                    soft_wrap=True,
                )
        stages.done("target and retain models, their evaluations", time.perf_counter() - start, setup=True)
        rule = sweep_rule(target_nll, cfg.retain_bound)
        made = _parallel(cfg, ctx, chosen, rule) if cfg.jobs > 1 else set()
        rows, _ = run_comparison(
            Comparison(
                chosen,
                rows=lambda name: _rows(
                    replace(cfg, resume=True) if name in made else cfg, name, ctx, rule, out / name
                ),
                write=lambda done: ctofu_report.write_report(
                    out,
                    "compare",
                    refs + done,
                    ctofu_pipeline.transfer_summary(done, ctx.forget_langs),
                    ctx.forget_langs,
                    {
                        **ctx.describe(),
                        "seconds": time.perf_counter() - start,
                        "host": host_precision(cfg.device, ctx),
                        "memorisation_by_lang": memorised,
                        "timing": stages.timing(ctx.built),
                    },
                ),
                audit=None
                if audit_opts is None
                else lambda name: ctofu_pipeline.audit_method(
                    name, ctx, out / name, audit_opts, cfg.device, audit_cache
                ),
                write_audit=lambda audits: tofu_report.write_audit_table(out, audits, ctx.describe()),
            ),
            stages,
            budget=cfg.budget_seconds(),
            keep_going=cfg.keep_going,
        )
    everything = refs + rows
    ctofu_report.heatmap(
        out / "fq_heatmap.png",
        everything,
        "forget_quality",
        f"Forget quality per language (forget data: {', '.join(ctx.forget_langs)})",
        log10=True,
    )
    ctofu_report.heatmap(
        out / "rouge_drop.png",
        everything,
        "rouge_drop",
        "Forget ROUGE-L drop vs the target model, per language",
        cmap="magma",
    )
    ctofu_report.heatmap(
        out / "prob_ratio.png",
        everything,
        "prob_ratio",
        f"Transfer: forget-set probability after / before, per language (forget data: {', '.join(ctx.forget_langs)})",
        cmap="cividis",
    )
    console.print(ctofu_report.matrix(everything, "forget_quality"))
    console.print(ctofu_report.transfer_table(ctofu_pipeline.transfer_summary(rows, ctx.forget_langs)))
    if audit_opts is not None:
        console.print((out / "AUDIT.md").read_text(), markup=False, soft_wrap=True)
    console.print(
        f"wrote {out}/compare.md, compare.json, fq_heatmap.png, rouge_drop.png and prob_ratio.png"
        + (" and AUDIT.md / AUDIT.json" if audit_opts is not None else "")
        + f" in {time.perf_counter() - start:.0f} s"
    )


configs_command(app, "ctofu")  # `mmunlearn ctofu configs`: the shipped configs (recipes/configs/ctofu/)
