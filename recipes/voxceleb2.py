"""VoxCeleb2 recipe (``mmunlearn voxceleb2 ...``): speaker- and sample-level forgetting for a speaker classifier.

Read top to bottom: ``prepare`` (VoxCeleb2 manifests), ``prepare-corpus`` (FSDD or any corpus with one
folder or file-name pattern per speaker, :mod:`data_prep.fsdd`) and ``synth`` (the built-in espeak-ng corpus)
are the data; ``train`` builds the original classifier or the retrained reference; ``speaker`` and
``sample`` unlearn with one or more methods and write one table (Markdown, CSV, JSON) and a plot
of accuracies. With no arguments ``speaker`` / ``sample`` run on the built-in corpus end to end
(synthesise, prepare, train, unlearn, report), reusing whatever an earlier run built.
``--model speech-llm`` runs the same levels with a Qwen-Omni-style speech LLM instead of the classifier
(:mod:`recipes.voxceleb2_speech_llm`: spoken "who is speaking?" answers to forget, a target task to keep);
``--model hf-audio`` with a small wav2vec2-style Hugging Face audio classifier (:mod:`recipes.voxceleb2_hf_audio`)
through the same steps, metrics and tables as the ECAPA classifier.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from data_prep.fsdd import prepare_corpus_command
from data_prep.voxceleb2 import prepare_command
from recipes import voxceleb2_pipeline as pipe
from recipes import voxceleb2_report as report
from recipes import voxceleb2_settings as cfg

app = typer.Typer(help="VoxCeleb2: speaker- and sample-level forgetting for a speaker classifier (ECAPA-TDNN) or a "
                       "speech LLM (--model speech-llm).",
                  no_args_is_help=True)
app.command("prepare")(prepare_command)
app.command("prepare-corpus")(prepare_corpus_command)
console = Console()

DEFAULT_WORKDIR = Path("runs/voxceleb2")
Manifests = Annotated[Optional[Path], typer.Option(help="Manifest folder written by `prepare`; default: the built-in corpus under --workdir (synthesised and prepared on first use).")]
Workdir = Annotated[Path, typer.Option(help="Built-in corpus (corpus/), its manifests (manifests/), trained models (models/) and, by default, results.")]
Speakers = Annotated[int, typer.Option(min=2, help="Built-in corpus: number of speakers.")]
Utterances = Annotated[int, typer.Option(min=2, help="Built-in corpus: utterances per speaker.")]
Videos = Annotated[int, typer.Option(min=2, help="Built-in corpus: videos (recording sessions) per speaker; one in five (at least one) is held out for testing.")]
ForgetSpeakers = Annotated[int, typer.Option(min=1, help="Built-in corpus: speakers to forget (speaker level), drawn by --seed.")]
ForgetFraction = Annotated[float, typer.Option(min=0.0, max=0.5, help="Built-in corpus: fraction of each kept speaker's training utterances to forget (sample level); as many become the never-trained holdout.")]
Preset = Annotated[str, typer.Option(help="Classifier size: tiny (tests), small (CPU demo), base or large (ECAPA sizes of SpeechBrain); with --model hf-audio: tiny, small or large wav2vec2 configs (recipes/voxceleb2_hf_audio.py).")]
TrainEpochs = Annotated[Optional[int], typer.Option(help="Classifier training epochs (default: the preset's).")]
TrainLr = Annotated[Optional[float], typer.Option(help="Classifier training peak learning rate (default: the preset's).")]
Crop = Annotated[float, typer.Option(min=0.0, help="Classifier training: random crops of this many seconds (0: whole utterances).")]
Seed = Annotated[int, typer.Option(help="Seed of the corpus, the splits, model initialisation, crops and unlearning.")]
Device = Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")]
Threads = Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads (default on CPU: 1, which is several times faster than 2 for ECAPA's small convolutions on a busy 2-core machine; on CUDA: torch's choice).")]
CacheDir = Annotated[Optional[Path], typer.Option(help="Where trained classifiers are cached (default: --workdir).")]


def _setup(device: str, threads: int | None) -> str:
    """Resolve ``auto`` and set the torch thread count (1 on CPU unless told otherwise)."""
    from mmunlearn.adapters.base import resolve_device
    from mmunlearn.errors import set_threads

    resolved = resolve_device(device).type
    set_threads(threads if threads is not None else 1 if resolved == "cpu" else None)
    return resolved


def _manifests(manifests: Path | None, workdir: Path, speakers: int, utterances: int, videos: int,
               forget_speakers: int, forget_fraction: float, seed: int) -> Path:
    if manifests is not None:
        if not (manifests / "train.csv").is_file():
            raise typer.BadParameter(f"{manifests} holds no train.csv: pass the output folder of `prepare`")
        return manifests
    return pipe.builtin_manifests(workdir, speakers=speakers, utterances=utterances, videos=videos,
                                  forget_speakers=forget_speakers, forget_fraction=forget_fraction, seed=seed)


def _spec(name: str, preset: str, epochs: int | None, lr: float | None, crop: float, seed: int,
          model: str = "classifier") -> pipe.ModelSpec:
    if model not in pipe.MODELS:
        raise typer.BadParameter(f"--model must be one of {', '.join(pipe.MODELS)} or speech-llm, got {model!r}")
    if model == "hf-audio":
        from recipes.voxceleb2_hf_audio import train_config

        train = train_config(preset, epochs=epochs, lr=lr)
    else:
        train = cfg.train_config(preset, epochs=epochs, lr=lr)
    return pipe.ModelSpec(name, preset, train.to_dict(), crop or None, seed, model)


@app.command()
def synth(
    out: Annotated[Path, typer.Option(help="Corpus root (VoxCeleb2 layout: dev/aac/idNNNNN/<video>/NNNNN.wav).")] = DEFAULT_WORKDIR / "corpus",
    speakers: Speakers = 20,
    utterances: Utterances = 30,
    videos: Videos = 3,
    seed: Seed = 0,
    jobs: Annotated[int, typer.Option(min=0, help="Worker processes (0: up to 2).")] = 0,
) -> None:
    """Synthesise the built-in espeak-ng speaker corpus (no download); a re-run with the same options does nothing."""
    from data_prep.synth_speakers import synthesize_corpus

    start = time.perf_counter()
    root = synthesize_corpus(out, speakers, utterances, videos, seed, jobs=jobs or None)
    console.print(f"corpus in [bold]{root}[/bold] ({speakers} speakers x {utterances} utterances, {videos} videos each; "
                  f"{time.perf_counter() - start:.0f} s)\nnext: mmunlearn voxceleb2 prepare --root {root} --out <manifests>")


@app.command()
def train(
    manifests: Manifests = None,
    retain_only: Annotated[bool, typer.Option(help="Train the retrained reference: without the forget speakers (--level speaker) or the forgotten utterances (--level sample).")] = False,
    level: Annotated[str, typer.Option(help="With --retain-only: speaker or sample; also the level the model is evaluated on.")] = "speaker",
    out: Annotated[Optional[Path], typer.Option(help="Also copy the trained model here (SpeechBrain EncoderClassifier layout; save_pretrained with --model hf-audio).")] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
    speakers: Speakers = 20,
    utterances: Utterances = 30,
    videos: Videos = 3,
    forget_speakers: ForgetSpeakers = 2,
    forget_fraction: ForgetFraction = 0.1,
    preset: Preset = "small",
    train_epochs: TrainEpochs = None,
    train_lr: TrainLr = None,
    crop_seconds: Crop = 2.0,
    seed: Seed = 0,
    device: Device = "auto",
    threads: Threads = None,
    cache_dir: CacheDir = None,
    model: Annotated[str, typer.Option(help="classifier (ECAPA-TDNN) or hf-audio (wav2vec2-style Hugging Face audio classifier built from a local config).")] = "classifier",
) -> None:
    """Train the speaker classifier on retain + forget (or the retrained reference), cached by its options; evaluate it."""
    if level not in pipe.PARTITIONS:
        raise typer.BadParameter(f"--level must be speaker or sample, got {level!r}")
    device = _setup(device, threads)
    data = _manifests(manifests, workdir, speakers, utterances, videos, forget_speakers, forget_fraction, seed)
    name = pipe.RETRAIN_NAME[level] if retain_only else "original"
    path = pipe.trained_model(data, _spec(name, preset, train_epochs, train_lr, crop_seconds, seed, model),
                              cache_dir or workdir, device=device)
    metrics = pipe.cached_eval(path, data, level, pipe.EvalOptions(seed=seed), device)
    if out is not None:
        pipe.load_classifier(path, "cpu").save(out, overwrite=True)
    console.print(f"{name} model in [bold]{out or path}[/bold]")
    console.print(report.markdown([{"method": name, **metrics}], level))


def _unlearn_speech_llm(level: str, out: Path | None, methods: str, manifests: Path | None, workdir: Path,
                        llm: str, where: str, target: str, reference: str | None, rank: int | None,
                        scale: float | None, seed: int, device: str, threads: int | None,
                        cache_dir: Path | None) -> None:
    """The ``--model speech-llm`` path: corpus (unless --manifests), models, every method, one table."""
    from recipes import voxceleb2_speech_llm as speech_llm

    chosen = list(speech_llm.DEFAULT_METHODS) if methods.strip() == "all" else [
        m.strip() for m in methods.split(",") if m.strip()]
    if where not in ("audio", "text", "both") or target not in ("gender", "transcript"):
        raise typer.BadParameter(f"--where must be audio|text|both and --target gender|transcript, got "
                                 f"{where!r} / {target!r}")
    device = _setup(device, threads)
    start = time.perf_counter()
    try:
        rows = speech_llm.run_level(level, manifests=str(manifests) if manifests else None,
                                    corpus=str(workdir / "speech_llm_corpus"), model=llm,
                                    out=str(out or workdir / "speech_llm"), methods=chosen, where=where,
                                    target=target, reference=reference, rank=rank, scale=scale, seed=seed,
                                    device=device, cache_dir=str(cache_dir) if cache_dir else None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(speech_llm.table_markdown(rows, level))
    console.print(f"wrote {(out or workdir / 'speech_llm') / level}/results.md, results.json and the energy plots "
                  f"in {time.perf_counter() - start:.0f} s")


def _unlearn(level: str, out: Path | None, methods: str, manifests: Path | None, workdir: Path, speakers: int,
             utterances: int, videos: int, forget_speakers: int, forget_fraction: float, preset: str,
             train_epochs: int | None, train_lr: float | None, crop_seconds: float, sweep: bool, retain_bound: float,
             rank: int | None, retain_rank: int | None, scale: float | None, extract: str | None,
             extract_steps: int | None, extract_lr: float | None, lr: float | None, epochs: int | None,
             segment_seconds: float | None, max_trials: int, seed: int, device: str, threads: int | None,
             cache_dir: Path | None, strict: bool = False, layer_rule: str | None = None,
             sweep_ranks: str | None = None, scope: str | None = None, forget_acc: float | None = None,
             audit: bool = False, audit_relearn_steps: int | None = None, audit_relearn_lr: float | None = None,
             audit_relearn_on: str | None = None, audit_attacks: str | None = None, model: str = "classifier") -> None:
    from mmunlearn.audit import write_audit

    start = time.perf_counter()
    try:
        chosen = cfg.parse_methods(methods)
        audit_opts = _audit_options(audit_relearn_steps, audit_relearn_lr, audit_relearn_on, audit_attacks,
                                    pipe.MODELS.get(model, "speaker")) if audit else None
        ranks = cfg.parse_ranks(sweep_ranks)
        if model == "hf-audio" and scope not in (None, "all"):
            raise ValueError(f"--scope {scope}: a Hugging Face audio classifier is edited in every Linear weight "
                             "(--scope all); the head/embedding scopes are the ECAPA classifier's")
        scope = scope or ("all" if model == "hf-audio" else "sweep" if sweep else "all")
        for name in chosen:
            cfg.scopes_for(name, scope, sweep)
        cfg.method_options(chosen[0], extract_kind=extract, layer_rule=layer_rule)  # validates before any work
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    device = _setup(device, threads)
    out = out or (workdir / "hf-audio" / level if model == "hf-audio" else workdir / level)
    data = _manifests(manifests, workdir, speakers, utterances, videos, forget_speakers, forget_fraction, seed)
    cache = cache_dir or workdir
    original = pipe.trained_model(data, _spec("original", preset, train_epochs, train_lr, crop_seconds, seed, model),
                                  cache, device=device)
    retrained = pipe.trained_model(data, _spec(pipe.RETRAIN_NAME[level], preset, train_epochs, train_lr, crop_seconds,
                                               seed, model), cache, device=device)
    opts = pipe.EvalOptions(segment_seconds=segment_seconds, max_trials=max_trials or None, seed=seed)
    ctx = pipe.make_context(level, data, original, retrained, opts, device)
    n_classes = len({r["spk_id"] for r in pipe.split_rows(data, "train")})
    rows = ctx.reference_rows()
    context = {**ctx.describe(), "preset": preset, "sweep": sweep, "retain_bound": retain_bound,
               "forget_acc": forget_acc, "seed": seed, "classes": n_classes, "model": model}
    if model == "hf-audio":
        from recipes.voxceleb2_hf_audio import describe

        context["model"] = describe(preset)
    audits, audit_cache = [], {}
    for i, name in enumerate(chosen, 1):
        console.print(f"[bold]{level} level[/bold]: {name} ({i}/{len(chosen)})")
        options = cfg.method_options(name, rank=rank, retain_rank=retain_rank, scale=scale, extract_kind=extract,
                                     extract_steps=extract_steps, extract_lr=extract_lr, lr=lr, epochs=epochs,
                                     layer_rule=layer_rule, sweep_ranks=ranks, seed=seed)
        rule = cfg.sweep_rule(level, n_classes, ctx.retain, retain_bound, forget_acc) if sweep else None
        if sweep:
            options = cfg.sweep_defaults(name, options)
            if epochs is None and not cfg.is_erasure(name):  # the step budget grows with the forget set
                options["epochs"] = cfg.epoch_budget(name, preset, options, len(ctx.forget))
        scope_options = {s: {k: v for k, v in o.items() if k not in options} for s, o in cfg.SCOPE_OPTIONS.items()}
        rows.append(pipe.run_method_row(name, ctx, cfg.preset_kind(preset), options, rule, out / name,
                                        scopes=cfg.scopes_for(name, scope, sweep), scope_options=scope_options))
        report.write_tables(out, rows, level, context)  # after each method: nothing lost if interrupted
        if audit_opts is not None:
            console.print(f"auditing {name} ...")
            audits.append(_audit_method(name, out / name, original, retrained, data, level, audit_opts, device,
                                        audit_cache, context))
            write_audit(out, audits, context)  # the comparison's table so far
    report.plot_accuracies(out / f"{level}_accuracy.png", rows, level,
                           chance=cfg.chance(n_classes) if level == "speaker" else None)
    missed = report.missed_targets(rows)
    if missed:  # the first line of the results, before the table
        console.print(f"[bold red]RULE NOT MET[/bold red] by {', '.join(missed)}: the table below shows models that "
                      "did not reach the forget target within the retain bound", soft_wrap=True)
    elif not sweep:
        console.print("[bold yellow]NOT CHECKED[/bold yellow]: --no-sweep ran the presets as they are; whether they "
                      "meet the rule was not measured", soft_wrap=True)
    console.print(report.markdown(rows, level))
    console.print(f"wrote {out}/{level}.md, .csv, .json and {level}_accuracy.png"
                  + (" and AUDIT.md / AUDIT.json" if audits else "") + f" in {time.perf_counter() - start:.0f} s")
    if missed:
        console.print(f"[bold red]sweep rule not met[/bold red] by {', '.join(missed)}")
        if strict:
            raise typer.Exit(1)


def _audit_options(steps: int | None, lr: float | None, on: str | None, attacks: str | None, kind: str = "speaker"):
    """``--audit-*`` as :class:`mmunlearn.audit.AuditOptions` for a classifier of the registered ``kind`` (raises
    ValueError, a usage error upstream)."""
    from mmunlearn.audit import ATTACKS
    from mmunlearn.audit.options import parse_list

    return cfg.audit_options(kind, relearn_steps=steps, relearn_lr=lr, relearn_on=on,
                             attacks=parse_list(attacks, ATTACKS, "--audit-attacks"))


def _audit_method(name: str, folder: Path, original: Path, retrained: Path, data: Path, level: str, options,
                  device: str, cache: dict, context: dict) -> dict:
    """Audit one method's classifier (``folder/model``) against the original and retrained ones:
    ``folder/AUDIT.json`` and ``.md``; the caller's ``cache`` keeps the reference models' attacks."""
    from mmunlearn.audit import write_audit
    from mmunlearn.audit.folder import audit_speaker_models

    result = audit_speaker_models(folder / "model", original, retrained, data, level=level, method=name,
                                  options=options, device=device, cache=cache)
    write_audit(folder, [result], context)
    return result


Out = Annotated[Optional[Path], typer.Option(help="Output folder: <level>.md/.csv/.json, <level>_accuracy.png, one folder per method (default: --workdir/<level>).")]
Methods = Annotated[str, typer.Option(help="Comma list of qr-erase, qr-erase-rows, svd-unlearn, grad_ascent, grad_diff, kl, npo, simnpo; or 'all'.")]
Sweep = Annotated[bool, typer.Option(help="Choose erasure rank/scale/scope and baseline epochs by the training-partition rule (see recipes/voxceleb2_settings.py); on by default, since the presets alone do not forget (--no-sweep: the presets as they are, e.g. to time one setting).")]
Strict = Annotated[bool, typer.Option(help="With --sweep: exit with status 1 when a method's sweep did not meet its rule (the tables are written first).")]
LayerRule = Annotated[Optional[str], typer.Option(help="Erasure: which layers to edit: mean (forget energy >= 1/|L|), top, threshold or all (default: the method's).")]
SweepRanks = Annotated[Optional[str], typer.Option(help="Erasure with --sweep: comma list of forget ranks tried, smallest first (default: 1,2,4).")]
Scope = Annotated[Optional[str], typer.Option(help="Erasure: weights to edit: all, head (class weights only; embeddings untouched), embedding, or sweep (the rule chooses among head, embedding and all on the training partitions; the default with --sweep, else all).")]
ForgetAcc = Annotated[Optional[float], typer.Option(min=0.0, max=0.99, help="Sweep rule, speaker level: accuracy on the forget speakers' training utterances to reach (default: chance, 1/classes).")]
RetainBound = Annotated[float, typer.Option(min=0.0, help="Sweep rule: largest allowed rise of the retain set's mean NLL (nats).")]
Rank = Annotated[Optional[int], typer.Option(min=1, help="Erasure: forget rank k per matrix (with --sweep: the only rank tried).")]
RetainRank = Annotated[Optional[int], typer.Option(min=1, help="Erasure: retain rank per matrix (capped at each matrix's size).")]
Scale = Annotated[Optional[float], typer.Option(help="Erasure: W' = W - scale * T~ (ignored with --sweep).")]
Extract = Annotated[Optional[str], typer.Option(help="Erasure task vectors: finetune or gradient (LoRA cannot wrap the cosine classifier).")]
ExtractSteps = Annotated[Optional[int], typer.Option(min=1, help="Erasure: fine-tuning steps per task vector.")]
ExtractLr = Annotated[Optional[float], typer.Option(help="Erasure: task-vector learning rate (gradient: step size).")]
Lr = Annotated[Optional[float], typer.Option(help="Baselines: learning rate.")]
Epochs = Annotated[Optional[int], typer.Option(min=1, help="Baselines: epochs over the forget set (with --sweep: the most).")]
Segment = Annotated[Optional[float], typer.Option(help="Evaluation: average logits/embeddings over windows of this many seconds (default: whole utterances).")]
MaxTrials = Annotated[int, typer.Option(min=0, help="Evaluation: at most this many verification trials, drawn by --seed (0: all pairs).")]
Model = Annotated[str, typer.Option(help="classifier (ECAPA-TDNN speaker classifier), hf-audio (a small wav2vec2-style transformers AutoModelForAudioClassification built from a local config, never downloaded; --preset sizes it; every method edits all its Linear weights; each method's <out>/<method>/model is a save_pretrained folder that transformers.pipeline('audio-classification') loads; default --out: --workdir/hf-audio/<level>) or speech-llm (Qwen-Omni-style model answering 'who is speaking?'; adds t3 to the methods).")]
Llm = Annotated[str, typer.Option(help="With --model speech-llm: preset tiny or mini (built from config, trained and cached), or a speech-LLM directory.")]
Where = Annotated[str, typer.Option(help="With --model speech-llm: erase in the audio tower, the language model (text) or both.")]
Target = Annotated[str, typer.Option(help="With --model speech-llm: the task that must survive on the same audio: gender or transcript.")]
Reference = Annotated[Optional[str], typer.Option(help="With --model speech-llm and a directory: the model it was fine-tuned from (task-vector reference).")]
Audit = Annotated[bool, typer.Option("--audit", help="Also run the robustness audits (held-out recordings, 8/4-bit quantisation, relearning, nearest-centroid probe) on every method's classifier: <out>/AUDIT.json and AUDIT.md beside the tables, and <out>/<method>/AUDIT.json.")]
AuditSteps = Annotated[Optional[int], typer.Option("--audit-relearn-steps", min=1, help=f"--audit: relearning optimizer steps (default {cfg.AUDIT_RELEARN['relearn_steps']}).")]
AuditLr = Annotated[Optional[float], typer.Option("--audit-relearn-lr", help=f"--audit: relearning learning rate (default {cfg.AUDIT_RELEARN['relearn_lr']:g}).")]
AuditOn = Annotated[Optional[str], typer.Option("--audit-relearn-on", help="--audit: relearn on part of the forget speakers' (utterances') training audio ('forget', default) or on retain data only ('retain', stricter).")]
AuditAttacks = Annotated[Optional[str], typer.Option("--audit-attacks", help="--audit: attacks to run, comma-separated (paraphrase = held-out recordings, quantise, relearn, probe; default all).")]


def _level_command(level: str):
    def command(
        out: Out = None, methods: Methods = "qr-erase", manifests: Manifests = None, workdir: Workdir = DEFAULT_WORKDIR,
        speakers: Speakers = 20, utterances: Utterances = 30, videos: Videos = 3,
        forget_speakers: ForgetSpeakers = 2, forget_fraction: ForgetFraction = 0.1, preset: Preset = "small",
        train_epochs: TrainEpochs = None, train_lr: TrainLr = None, crop_seconds: Crop = 2.0, sweep: Sweep = True,
        strict: Strict = False, layer_rule: LayerRule = None, sweep_ranks: SweepRanks = None, scope: Scope = None,
        retain_bound: RetainBound = cfg.DEFAULT_RETAIN_BOUND, forget_acc: ForgetAcc = None, rank: Rank = None, retain_rank: RetainRank = None,
        scale: Scale = None, extract: Extract = None, extract_steps: ExtractSteps = None, extract_lr: ExtractLr = None,
        lr: Lr = None, epochs: Epochs = None, segment_seconds: Segment = None, max_trials: MaxTrials = 20000,
        seed: Seed = 0, device: Device = "auto", threads: Threads = None, cache_dir: CacheDir = None,
        model: Model = "classifier", llm: Llm = "mini", where: Where = "both", target: Target = "gender",
        reference: Reference = None, audit: Audit = False, audit_relearn_steps: AuditSteps = None,
        audit_relearn_lr: AuditLr = None, audit_relearn_on: AuditOn = None, audit_attacks: AuditAttacks = None,
    ) -> None:
        if model == "speech-llm":
            if audit:
                raise typer.BadParameter("--audit runs on the classifier here; audit a speech-LLM method's output "
                                         "folder with `mmunlearn audit --model DIR ...`")
            _unlearn_speech_llm(level, out, methods, manifests, workdir, llm, where, target, reference, rank, scale,
                                seed, device, threads, cache_dir)
            return
        if model not in pipe.MODELS:
            raise typer.BadParameter(f"--model must be classifier, hf-audio or speech-llm, got {model!r}")
        _unlearn(level, **{k: v for k, v in locals().items()
                           if k not in ("level", "llm", "where", "target", "reference")})

    return command


app.command("speaker", help="Speaker-level forgetting: remove whole speakers; forget/retain/test accuracy, EER, "
                            "next to the original and the retrained (without those speakers) models.")(_level_command("speaker"))
app.command("sample", help="Sample-level forgetting: remove some training utterances of kept speakers; accuracies, "
                           "EER and the membership-inference AUC (forget vs never-trained holdout).")(_level_command("sample"))
