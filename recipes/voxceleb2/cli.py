"""VoxCeleb2 recipe (``mmunlearn voxceleb2 ...``): speaker- and sample-level forgetting for a speaker classifier.

Read top to bottom: ``prepare`` (VoxCeleb2 manifests), ``prepare-corpus`` (FSDD or any corpus with one
folder or file-name pattern per speaker, :mod:`data_prep.fsdd`) and ``synth`` (the built-in espeak-ng corpus)
are the data (``subset``: the same clips, fewer per split); ``train`` builds the original classifier or the retrained
reference; ``speaker`` and ``sample`` unlearn with one or more methods and write one table (Markdown, CSV, JSON) and a
plot of accuracies. With no arguments ``speaker`` / ``sample`` run on the built-in corpus end to end
(synthesise, prepare, train, unlearn, report), reusing whatever an earlier run built. Their settings are one
:class:`recipes.voxceleb2.config.VoxCelebConfig` (options, ``--config FILE.yaml``, ``key=value``,
``--method-option METHOD.SETTING=VALUE``: :mod:`recipes.recipe_cli`), and each method runs through
:func:`recipes.runner.run_method` (``<out>/<method>/{model/, run.json}``).
``--model speech-llm`` runs the same levels with a Qwen-Omni-style speech LLM instead of the classifier
(:mod:`recipes.voxceleb2.speech_llm`: spoken "who is speaking?" answers to forget, a target task to keep);
``--model hf-audio`` with a small wav2vec2-style Hugging Face audio classifier
(:mod:`mmunlearn.adapters.hf_audio.training`)
through the same steps, metrics and tables as the ECAPA classifier.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from data_prep.fsdd import prepare_corpus_command
from data_prep.manifest_subset import subset_command
from data_prep.synth_speakers import synthesize_corpus
from data_prep.voxceleb2 import prepare_command
from mmunlearn.adapters.base import resolve_device
from mmunlearn.audit import write_audit
from mmunlearn.audit.folder import audit_speaker_models
from mmunlearn.config.command import mount, settings_command
from mmunlearn.errors import set_threads
from recipes.recipe_cli import config_command, configs_command, help_of
from recipes.runner import Comparison, Stages, run_comparison
from recipes.voxceleb2 import pipeline as pipe
from recipes.voxceleb2 import report, settings, speech_llm
from recipes.voxceleb2.config import DEFAULT_WORKDIR, VoxCelebConfig

app = typer.Typer(
    help="VoxCeleb2: speaker- and sample-level forgetting for a speaker classifier (ECAPA-TDNN) or a "
    "speech LLM (--model speech-llm).",
    no_args_is_help=True,
)
mount(app, "prepare", prepare_command)
mount(app, "prepare-corpus", prepare_corpus_command)
app.command("subset")(subset_command)
console = Console()


def _help(key: str) -> str:
    return help_of(VoxCelebConfig, key)


# ``train`` and ``synth`` options; their help is the config field's (declared once; train's settings too).
Manifests = Annotated[Path | None, typer.Option(help=_help("manifests"))]
Workdir = Annotated[Path, typer.Option(help=_help("workdir"))]
Speakers = Annotated[int, typer.Option(min=2, help=_help("speakers"))]
Utterances = Annotated[int, typer.Option(min=2, help=_help("utterances"))]
Videos = Annotated[int, typer.Option(min=2, help=_help("videos"))]
Preset = Annotated[str, typer.Option(help=_help("preset"))]
Seed = Annotated[int, typer.Option(help=_help("seed"))]
Device = Annotated[str, typer.Option(help=_help("device"))]


def _setup(device: str, threads: int | None) -> str:
    """Resolve ``auto`` and set the torch thread count (1 on CPU unless told otherwise)."""
    resolved = resolve_device(device).type
    set_threads(threads if threads is not None else 1 if resolved == "cpu" else None)
    return resolved


def _manifests(
    manifests: Path | None,
    workdir: Path,
    speakers: int,
    utterances: int,
    videos: int,
    forget_speakers: int,
    forget_fraction: float,
    seed: int,
) -> Path:
    if manifests is not None:
        if not (manifests / "train.csv").is_file():
            raise typer.BadParameter(f"{manifests} holds no train.csv: pass the output folder of `prepare`")
        return manifests
    return pipe.builtin_manifests(
        workdir,
        speakers=speakers,
        utterances=utterances,
        videos=videos,
        forget_speakers=forget_speakers,
        forget_fraction=forget_fraction,
        seed=seed,
    )


def _spec(
    name: str, preset: str, epochs: int | None, lr: float | None, crop: float, seed: int, model: str = "classifier"
) -> pipe.ModelSpec:
    try:
        family = pipe.family(model)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    train = family.train_config(preset, epochs=epochs, lr=lr)
    return pipe.ModelSpec(name, preset, train.to_dict(), crop or None, seed, model)


@app.command()
def synth(
    out: Annotated[
        Path, typer.Option(help="Corpus root (VoxCeleb2 layout: dev/aac/idNNNNN/<video>/NNNNN.wav).")
    ] = DEFAULT_WORKDIR / "corpus",
    speakers: Speakers = 20,
    utterances: Utterances = 30,
    videos: Videos = 3,
    seed: Seed = 0,
    jobs: Annotated[int, typer.Option(min=0, help="Worker processes (0: up to 2).")] = 0,
) -> None:
    """Synthesise the built-in espeak-ng speaker corpus (no download); a re-run with the same options does nothing."""
    start = time.perf_counter()
    root = synthesize_corpus(out, speakers, utterances, videos, seed, jobs=jobs or None)
    console.print(
        f"corpus in [bold]{root}[/bold] ({speakers} speakers x {utterances} utterances, {videos} videos each; "
        f"{time.perf_counter() - start:.0f} s)\nnext: mmunlearn voxceleb2 prepare --root {root} --out <manifests>"
    )


#: `train`'s settings (KEY=VALUE, --key VALUE or --config; fields of VoxCelebConfig, help declared there)
TRAIN_SETTINGS = (
    "speakers",
    "utterances",
    "videos",
    "forget_speakers",
    "forget_fraction",
    "train_epochs",
    "train_lr",
    "crop_seconds",
    "seed",
    "threads",
    "cache_dir",
)


@settings_command(app, VoxCelebConfig, TRAIN_SETTINGS, name="train")
def train(
    manifests: Manifests = None,
    retain_only: Annotated[
        bool,
        typer.Option(
            help="Train the retrained reference: without the forget speakers (--level speaker) or the forgotten "
            "utterances (--level sample)."
        ),
    ] = False,
    level: Annotated[
        str, typer.Option(help="With --retain-only: speaker or sample; also the level the model is evaluated on.")
    ] = "speaker",
    out: Annotated[
        Path | None,
        typer.Option(
            help="Also copy the trained model here (SpeechBrain EncoderClassifier layout; save_pretrained with "
            "--model hf-audio)."
        ),
    ] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
    preset: Preset = "small",
    device: Device = "auto",
    model: Annotated[
        str,
        typer.Option(
            help="classifier (ECAPA-TDNN), hf-audio (wav2vec2-style Hugging Face audio classifier built from a local "
            "config) or any installed classifier kind with a trainer."
        ),
    ] = "classifier",
    settings: dict | None = None,
) -> None:
    """Train the speaker classifier on retain + forget (or the retrained reference), cached by its options;
    evaluate it."""
    if level not in pipe.PARTITIONS:
        raise typer.BadParameter(f"--level must be speaker or sample, got {level!r}")
    given = VoxCelebConfig(**(settings or {}))
    device = _setup(device, given.threads)
    data = _manifests(
        manifests,
        workdir,
        given.speakers,
        given.utterances,
        given.videos,
        given.forget_speakers,
        given.forget_fraction,
        given.seed,
    )
    name = pipe.RETRAIN_NAME[level] if retain_only else "original"
    spec = _spec(name, preset, given.train_epochs, given.train_lr, given.crop_seconds, given.seed, model)
    path = pipe.trained_model(data, spec, given.cache_dir or workdir, device=device)
    metrics = pipe.cached_eval(path, data, level, pipe.EvalOptions(seed=given.seed), device)
    if out is not None:
        pipe.load_classifier(path, "cpu").save(out, overwrite=True)
    console.print(f"{name} model in [bold]{out or path}[/bold]")
    console.print(report.markdown([{"method": name, **metrics}], level))


def _unlearn_speech_llm(level: str, cfg: VoxCelebConfig) -> None:
    """The ``--model speech-llm`` path: corpus (unless --manifests), models, every method, one table."""
    device = _setup(cfg.device, cfg.threads)
    start = time.perf_counter()
    try:
        rows = speech_llm.run_level(level, cfg, device)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(speech_llm.table_markdown(rows, level))
    out = speech_llm.level_out(cfg) / level
    console.print(
        f"wrote {out}/results.md, results.json, one folder per method (model/, run.json) and the "
        f"energy plots in {time.perf_counter() - start:.0f} s"
    )
    _missed(report.missed_targets(rows), cfg.strict)


def _method_row(name: str, cfg: VoxCelebConfig, ctx: pipe.SpeakerSetup, n_classes: int, out: Path) -> dict:
    """One method's row (``out/{model/, run.json}``): its overrides, the sweep's defaults and step budget, the rule,
    the scopes it runs with (:func:`recipes.voxceleb2.pipeline.run_method_row`)."""
    options = cfg.method_overrides(name)
    rule = (
        settings.sweep_rule(ctx.level, n_classes, ctx.retain, cfg.resolved_retain_bound(), cfg.forget_acc)
        if cfg.sweep
        else None
    )
    if cfg.sweep:
        options = settings.sweep_defaults(name, options)
        if "epochs" not in options and not settings.is_erasure(name):  # the step budget grows with the forget set
            options["epochs"] = settings.epoch_budget(name, cfg.preset, options, len(ctx.forget))
    scope_options = {s: {k: v for k, v in o.items() if k not in options} for s, o in settings.SCOPE_OPTIONS.items()}
    return pipe.run_method_row(
        name,
        ctx,
        settings.preset_kind(cfg.preset),
        options,
        rule,
        out,
        scopes=settings.scopes_for(name, cfg.resolved_scope(), cfg.sweep),
        scope_options=scope_options,
        method_options=cfg.method_options.get(name),
        resume=cfg.resume,
    )


def _unlearn(level: str, cfg: VoxCelebConfig) -> None:
    """The classifier path (ECAPA or hf-audio): corpus, cached models and references, every method, the tables."""
    start = time.perf_counter()
    chosen = cfg.chosen()
    audit_opts = cfg.audit_options() if cfg.audit else None
    device = _setup(cfg.device, cfg.threads)
    family = pipe.family(cfg.model)
    out = cfg.out or (cfg.workdir / level if family.unprefixed else cfg.workdir / cfg.model / level)
    data = _manifests(
        cfg.manifests,
        cfg.workdir,
        cfg.speakers,
        cfg.utterances,
        cfg.videos,
        cfg.forget_speakers,
        cfg.forget_fraction,
        cfg.seed,
    )
    cache = cfg.cache_dir or cfg.workdir
    original, retrained = (
        pipe.trained_model(
            data,
            _spec(name, cfg.preset, cfg.train_epochs, cfg.train_lr, cfg.crop_seconds, cfg.seed, cfg.model),
            cache,
            device=device,
        )
        for name in ("original", pipe.RETRAIN_NAME[level])
    )
    opts = pipe.EvalOptions(segment_seconds=cfg.segment_seconds, max_trials=cfg.max_trials or None, seed=cfg.seed)
    ctx = pipe.make_context(level, data, original, retrained, opts, device, preset=cfg.preset)
    n_classes = len({r["spk_id"] for r in pipe.split_rows(data, "train")})
    rows = ctx.reference_rows()
    context = {
        **ctx.describe(),
        "preset": cfg.preset,
        "sweep": cfg.sweep,
        "retain_bound": cfg.resolved_retain_bound(),
        "forget_acc": cfg.forget_acc,
        "seed": cfg.seed,
        "classes": n_classes,
        "model": {"model": cfg.model, **family.describe(cfg.preset)},
    }
    if cfg.method_options:
        context["method_options"] = cfg.method_options
    audit_cache: dict = {}
    stages = Stages(
        len(chosen) + 1, start, say=lambda line: console.print(f"{level} level: {line}", markup=False, soft_wrap=True)
    )
    stages.done("original and retrained models, their evaluations", time.perf_counter() - start, setup=True)
    done, audits = run_comparison(
        Comparison(
            chosen,
            rows=lambda name: [_method_row(name, cfg, ctx, n_classes, out / name)],
            write=lambda got: report.write_tables(out, rows + got, level, context),
            audit=None
            if audit_opts is None
            else lambda name: _audit_method(
                name, out / name, original, retrained, data, level, audit_opts, device, audit_cache, context
            ),
            write_audit=lambda got: write_audit(out, got, context),
        ),
        stages,
    )
    rows += done
    report.plot_accuracies(
        out / f"{level}_accuracy.png",
        rows,
        level,
        chance=settings.chance_accuracy(n_classes) if level == "speaker" else None,
    )
    missed = report.missed_targets(rows)
    if missed:  # the first line of the results, before the table
        console.print(
            f"[bold red]RULE NOT MET[/bold red] by {', '.join(missed)}: the table below shows models that "
            "did not reach the forget target within the retain bound",
            soft_wrap=True,
        )
    elif not cfg.sweep:
        console.print(
            "[bold yellow]NOT CHECKED[/bold yellow]: --no-sweep ran the presets as they are; whether they "
            "meet the rule was not measured",
            soft_wrap=True,
        )
    console.print(report.markdown(rows, level))
    console.print(
        f"wrote {out}/{level}.md, .csv, .json and {level}_accuracy.png"
        + (" and AUDIT.md / AUDIT.json" if audits else "")
        + f" in {time.perf_counter() - start:.0f} s"
    )
    _missed(missed, cfg.strict)


def _missed(missed: list[str], strict: bool) -> None:
    """The last line when a method's sweep did not meet its rule; with ``strict``, exit status 1."""
    if missed:
        console.print(f"[bold red]sweep rule not met[/bold red] by {', '.join(missed)}")
        if strict:
            raise typer.Exit(1)


def _audit_method(
    name: str,
    folder: Path,
    original: Path,
    retrained: Path,
    data: Path,
    level: str,
    options,
    device: str,
    cache: dict,
    context: dict,
) -> dict:
    """Audit one method's classifier (``folder/model``) against the original and retrained ones:
    ``folder/AUDIT.json`` and ``.md``; the caller's ``cache`` keeps the reference models' attacks."""
    result = audit_speaker_models(
        folder / "model",
        original,
        retrained,
        data,
        level=level,
        method=name,
        options=options,
        device=device,
        cache=cache,
    )
    write_audit(folder, [result], context)
    return result


def _run_level(level: str, cfg: VoxCelebConfig) -> None:
    if cfg.kind.is_classifier:  # ECAPA, hf-audio or any classifier kind with a trainer (pipe.family)
        _unlearn(level, cfg)
    else:
        _unlearn_speech_llm(level, cfg)


# kind None: --method-option takes any registered method; the config checks it applies to --model
@config_command(app, VoxCelebConfig, name="speaker", kind=None, benchmark="voxceleb2", options=("manifests", "model"))
def speaker(cfg: VoxCelebConfig) -> None:
    """Speaker-level forgetting: remove whole speakers; forget/retain/test accuracy, EER, next to the original and
    the retrained (without those speakers) models."""
    _run_level("speaker", cfg)


@config_command(app, VoxCelebConfig, name="sample", kind=None, benchmark="voxceleb2", options=("manifests", "model"))
def sample(cfg: VoxCelebConfig) -> None:
    """Sample-level forgetting: remove some training utterances of kept speakers; accuracies, EER and the
    membership-inference AUC (forget vs never-trained holdout)."""
    _run_level("sample", cfg)


configs_command(app, "voxceleb2")  # `mmunlearn voxceleb2 configs`: the shipped configs (recipes/configs/voxceleb2/)
