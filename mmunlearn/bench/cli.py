"""Typer app of the benchmarks, mounted as ``mmunlearn bench`` and runnable as ``python -m mmunlearn.bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from mmunlearn.atomic import write_json_atomic, write_text_atomic
from mmunlearn.bench import precision as pb, requests as rb, stream as stb, subspace as sb, tilt as tb
from mmunlearn.bench.requests_tofu import run_tofu
from mmunlearn.errors import set_threads

app = typer.Typer(help="Benchmarks: print a table, optionally write JSON.", no_args_is_help=True)
console = Console()


def _set_threads(n: int | None) -> None:
    set_threads(n)


@app.command(context_settings={"allow_extra_args": True})
def subspace(
    ctx: typer.Context,
    sizes: Annotated[list[int], typer.Option(help="Matrix sizes n (n x n task matrices); repeat the option or list several values.")] = [768, 1024, 2048, 4096],  # noqa: B006
    rank: Annotated[int, typer.Option(help="Subspace rank k.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed repeats per method (the median is reported).")] = 3,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write rows, checks and machine info to this JSON file.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the table as Markdown to this file.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if a target is missed.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
) -> None:
    """Time full SVD, full LAPACK CPQR, truncated CPQR (LAPACK and torch), sketched CPQR and
    randomised SVD on the same task matrices; report speed-up, residual and subspace cosines."""
    _set_threads(threads)
    # `--sizes 768 1024 2048` (the values after the first arrive as extra arguments)
    try:
        sizes = list(sizes) + [int(a) for a in ctx.args]
    except ValueError as exc:
        raise typer.BadParameter(f"--sizes takes integers, got extra arguments {ctx.args}") from exc
    meta = sb.machine()
    console.print(f"[bold]subspace benchmark[/bold] on {meta['cpu']} ({meta['threads']} threads), "
                  f"torch {meta['torch']}, sizes {sizes}, k={rank}, median of {repeats}")

    def show(row):
        console.print(f"  n={row.size:5d} {row.spectrum:8s} {row.method:12s} {row.seconds:9.4f} s "
                      f"{row.speedup:8.1f}x  residual {sb.fmt_ratio(row.residual_ratio)}  cos {row.min_cosine:.4f}",
                      soft_wrap=True)

    rows = sb.run(sorted(sizes), rank, repeats=repeats, progress=show)
    table = Table(title=f"Subspace recovery, k = {rank}, float32")
    for col in ("n", "spectrum", "method", "time (s)", "speed-up vs SVD", "residual / optimal", "min cosine"):
        table.add_column(col, justify="left" if col in ("spectrum", "method") else "right")
    for r in rows:
        table.add_row(str(r.size), r.spectrum, r.method, f"{r.seconds:.4f}", f"{r.speedup:.1f}x",
                      sb.fmt_ratio(r.residual_ratio), f"{r.min_cosine:.4f}")
    console.print(table)
    checks = sb.check_targets(rows)
    for name, ok, measured in checks:
        console.print(f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  {name}: {measured}")
    if json_out is not None:
        sb.write_json(json_out, rows, checks, meta)
        console.print(f"wrote {json_out}")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(sb.markdown(rows) + "\n")
    if strict and not all(ok for _, ok, _ in checks):
        raise typer.Exit(1)


@app.command()
def tilt(
    preset: Annotated[str, typer.Option(help="Architecture preset of the (random-init) model: micro or mini.")] = "mini",
    batch: Annotated[int, typer.Option(help="Prompts decoded together.")] = 16,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt (EOS disabled).")] = 64,
    repeats: Annotated[int, typer.Option(help="Alternating plain/tilted runs (median reported).")] = 5,
    rank: Annotated[int, typer.Option(help="Tilt head rank h.")] = 20,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the result to this JSON file.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if the overhead is 15% or more.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
) -> None:
    """T3 throughput: tilted vs plain greedy generation, tokens/s on the same prompts in one run."""
    import json

    _set_threads(threads)
    row = tb.run(preset, batch=batch, new_tokens=new_tokens, repeats=repeats, rank=rank)
    table = Table(title=f"T3 generation throughput ({preset}, batch {batch}, {new_tokens} new tokens)")
    for col in ("plain tok/s", "tilted tok/s", "overhead per token", "head params", "model params"):
        table.add_column(col, justify="right")
    table.add_row(f"{row.plain_tokens_per_s:.1f}", f"{row.tilted_tokens_per_s:.1f}", f"{100 * row.overhead:+.1f}%",
                  f"{row.head_parameters:,}", f"{row.model_parameters:,}")
    console.print(table)
    ok = row.overhead < 0.15
    console.print(f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  token-level head costs under 15% extra "
                  f"time per generated token: {100 * row.overhead:+.1f}%")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(row.to_dict(), indent=2))
    if strict and not ok:
        raise typer.Exit(1)


@app.command()
def stream(
    arch: Annotated[str, typer.Option(help="Tensor names and shapes of the random checkpoint: llama-3.2-1b (2.3 GiB bf16) or tiny.")] = "llama-3.2-1b",
    shard_mb: Annotated[float, typer.Option(help="max_shard_size of the checkpoint in MB (shards split as save_pretrained does).")] = 500,
    hot: Annotated[Optional[list[int]], typer.Option(help="Blocks given 4x the forget energy, i.e. the ones erased (default: three spread over the depth).")] = None,
    rank: Annotated[int, typer.Option(help="Rank of the forget and retain bases.")] = 8,
    task_layers: Annotated[Optional[int], typer.Option(help="Task matrices for the first N blocks only (default: every block).")] = None,
    workdir: Annotated[Optional[Path], typer.Option(help="Where the checkpoint is generated (default: the system temp dir).")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the generated checkpoint, task matrices and outputs.")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the result to this JSON file.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the table as Markdown to this file.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if a target is missed.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads in each erase process (default: torch's choice).")] = None,
) -> None:
    """Streaming vs in-memory erase of a sharded random-weight checkpoint: wall time and peak RSS of
    each path (each in its own process), sizes, and a file-by-file comparison of their outputs."""
    import json

    res = stb.run(arch, shard_mb=shard_mb, hot=hot, rank=rank, task_layers=task_layers, workdir=workdir, keep=keep,
                  threads=threads)
    gb = stb.GB
    table = Table(title=f"Erase of a sharded {arch} checkpoint ({res.model_bytes / gb:.2f} GiB, {res.shards} shards), "
                        f"rank {rank}, blocks {res.hot_layers} edited")
    for col in ("path", "wall time (s)", "peak RSS (GiB)", "RSS before work (GiB)"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for r in res.rows:
        table.add_row(r.path, f"{r.seconds:.1f}", f"{r.peak_rss / gb:.2f}", f"{r.baseline_rss / gb:.2f}")
    console.print(table)
    console.print(f"largest shard {res.largest_shard / gb:.2f} GiB; one block's task matrices (forget + retain) "
                  f"{res.layer_task_bytes / gb:.2f} GiB; all task matrices {res.task_bytes / gb:.2f} GiB; "
                  f"{res.shards_rewritten} of {res.shards} shards rewritten by the streaming path, the rest hard-linked; "
                  f"generating the inputs took {res.build_seconds:.0f} s")
    stream_row = next(r for r in res.rows if r.path == "stream")
    checks = [(f"streaming peak RSS under {stb.TARGET} x (largest shard + one block's task matrices) = "
               f"{res.target / gb:.2f} GiB", stream_row.peak_rss < res.target, f"{stream_row.peak_rss / gb:.2f} GiB"),
              ("both paths write identical files", res.identical, "identical" if res.identical else "different")]
    for name, ok, measured in checks:
        console.print(f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  {name}: {measured}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({**res.to_dict(), "checks": [{"check": n, "passed": ok, "measured": m}
                                                                    for n, ok, m in checks]}, indent=2))
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(stb.markdown(res) + "\n")
    if strict and not all(ok for _, ok, _ in checks):
        raise typer.Exit(1)


@app.command()
def precision(
    model: Annotated[str, typer.Option(help="A real checkpoint (smollm2-135m), a save_pretrained folder, or a random-init preset architecture (micro, mini; with a BPE trained on --data).")] = "smollm2-135m",
    data: Annotated[str, typer.Option(help="QA rows: a TOFU folder (e.g. ../shared/data/tofu) or the built-in synthetic[:...] data.")] = "synthetic",
    split: Annotated[str, typer.Option(help="The split whose first --batch rows make the batch.")] = "forget10",
    batch: Annotated[int, typer.Option(min=1, help="QA rows per batch (one training step, one scoring call, prompts decoded together).")] = 16,
    new_tokens: Annotated[int, typer.Option(min=1, help="Greedy tokens generated at most per question (decoding stops when every row has met EOS).")] = 32,
    repeats: Annotated[int, typer.Option(min=1, help="Timed rounds over both implementations and precisions after one warm-up each (median reported).")] = 3,
    stage: Annotated[Optional[list[str]], typer.Option(help="Stages to run: train, score, generate (repeat the option; default: all).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write rows, timings, checks and machine facts to this JSON file (atomic write).")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the table, goal lines and checks as Markdown to this file.")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads (1: measured best on a shared 2-core machine).")] = 1,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if a mmunlearn/plain ratio is below 0.9, bf16 scoring misses its NLL bound or the two implementations disagree (the greedy-answer bound, meant for a memorised model, is reported only).")] = False,
) -> None:
    """Tokens/s of the project's training step, scoring and greedy generation beside a plain PyTorch +
    transformers loop, in float32 and bf16, on the same real QA batch in one run; bf16's accuracy against
    float32 and whether the project reaches 0.9x the plain loop."""
    _set_threads(threads)
    stages = tuple(stage or pb.STAGES)
    bad = [s for s in stages if s not in pb.STAGES]
    if bad:
        raise typer.BadParameter(f"unknown stage(s) {bad}; choose from {', '.join(pb.STAGES)}", param_hint="--stage")
    res = pb.run(model, data=data, split=split, batch=batch, new_tokens=new_tokens, repeats=repeats, stages=stages,
                 progress=lambda m: console.print(f"[dim]{m}[/dim]"))
    table = Table(title=f"{res.model}: {res.parameters / 1e6:.1f}M parameters; {res.batch} QA of {res.split} "
                        f"({res.batch_tokens} tokens, {res.answer_tokens} answer tokens); up to {new_tokens} new "
                        f"tokens; median of {repeats}")
    for i, col in enumerate(pb.COLUMNS):
        table.add_column(col, justify="right" if 2 <= i <= 5 else "left")
    for cells in pb.table_rows(res):
        table.add_row(*cells)
    console.print(table)
    for line in pb.goal_lines(res):
        console.print(line if "goal met" in line else f"[red]{line}[/red]")
    for c in res.checks:
        if c.kind != "goal":
            console.print(f"{'[green]PASS[/green]' if c.passed else '[red]MISS[/red]'}  {c.name}: {c.measured}")
    if res.bf16_copy_seconds is not None:
        console.print(f"bf16 generation copy (entering bf16_generation, once, not timed above): "
                      f"{res.bf16_copy_seconds:.2f} s")
    console.print(pb.facts_line(res))
    if json_out is not None:
        write_json_atomic(json_out, res.to_dict())
        console.print(f"wrote {json_out}")
    if markdown_out is not None:
        write_text_atomic(markdown_out, pb.markdown(res) + "\n")
    if strict and not all(c.passed for c in res.checks if c.kind != "memorised"):
        raise typer.Exit(1)


def _show_request(row: rb.RequestRow) -> None:
    """Print one request's row of ``bench requests`` as it is measured."""
    console.print(f"  request {row.request} {row.method:9s} {row.extract or '':9s} {row.seconds:8.2f} s "
                  f"(method {row.method_seconds:.2f} s)  forget {row.forget_before:.3f} -> {row.forget_after:.3f} "
                  f"(target {row.forget_target:.3f})  retain {row.retain_after - row.retain_before:+.4f} "
                  f"(bound {row.retain_bound:g})  peak +{row.peak_extra_mb:.0f} MiB"
                  + ("" if row.forgotten_any is None else
                     f"  forgotten -> any forgotten {100 * row.forgotten_any:.1f} %, largest share on one retained "
                     f"speaker {100 * row.forgotten_sink:.1f} %"), soft_wrap=True)


def _print_batch(batch: dict) -> None:
    """Print the batch line of ``bench requests``: the union's edit against the requests one by one."""
    console.print(f"batch of {len(batch['forget_nll_union'])} requests ({batch['extract']} extraction), edited once "
                  f"with the union in {batch['union_method_seconds']:.1f} s (rule met: "
                  f"{batch['union_target_reached']}): {'identical to' if batch['identical'] else 'differs from'} "
                  f"one by one (largest relative weight difference {batch['max_relative_weight_difference']:.3g}); "
                  f"forget NLL union {[round(x, 3) for x in batch['forget_nll_union']]} vs one by one "
                  f"{[round(x, 3) for x in batch['forget_nll_one_by_one']]}; retain NLL "
                  f"{batch['retain_nll_union']:.4f} vs {batch['retain_nll_one_by_one']:.4f}", soft_wrap=True)


def _print_requests_result(res: rb.BenchResult, preset: str) -> bool:
    """Print the ``bench requests`` table, batch, retrained-model and verdict lines; whether the target was met."""
    console.print(f"[bold]Deletion requests, {res.dataset}, {preset} preset, QR-Erase scope "
                  f"{res.setup.get('scope', 'all')}, retain state prepared once in {res.prepare_seconds:.1f} s[/bold]",
                  soft_wrap=True)
    console.print(rb.markdown(res), soft_wrap=True, markup=False, highlight=False)  # never cut at 80 columns
    summary = res.summary()
    batch = res.setup.get("batch")
    if batch:
        _print_batch(batch)
    retrained = res.setup.get("retrained")
    if retrained:
        console.print(f"retrained model (retained speakers only): forgotten -> any forgotten "
                      f"{100 * retrained['forgotten_any']:.1f} %, largest share on one retained speaker "
                      f"{100 * retrained['forgotten_sink']:.1f} % (the last request's row should match these)",
                      soft_wrap=True)
    best = [s for s in summary if s["method"] == "qr-erase"]
    ok = any(s["speedup_vs_grad_diff"] >= rb.TARGET_SPEEDUP and s["met_rule"] == s["requests"] for s in best)
    console.print(f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  a QR-Erase request (retain state cached) "
                  f"{rb.TARGET_SPEEDUP:g}x faster than GradDiff, every request meeting the rule: "
                  + ", ".join(f"{s['extract']} {s['speedup_vs_grad_diff']:.1f}x, {s['met_rule']}/{s['requests']}"
                              for s in best))
    return ok


@app.command()
def requests(
    dataset: Annotated[str, typer.Option(help="speaker (classifier on the built-in espeak corpus) or tofu (text LLM, one request per forget author).")] = "speaker",
    workdir: Annotated[Path, typer.Option(help="Folder for the corpus, the trained classifier and the retain state (reused when present).")] = Path("runs/bench_requests"),
    preset: Annotated[str, typer.Option(help="Model preset: speaker tiny or small; tofu micro or mini.")] = "tiny",
    data: Annotated[str, typer.Option(help="tofu: a TOFU folder or synthetic[:...] (models built by the preset builder, cached).")] = "synthetic",
    forget_split: Annotated[str, typer.Option(help="tofu: forget split (forget01, forget05, forget10).")] = "forget10",
    authors: Annotated[Optional[int], typer.Option(min=2, help="tofu: world of N authors (default: all of them).")] = 20,
    speakers: Annotated[int, typer.Option(min=3, help="Speakers of the built-in espeak corpus.")] = 10,
    utterances: Annotated[int, typer.Option(min=2, help="Utterances per speaker and video.")] = 20,
    videos: Annotated[int, typer.Option(min=2, help="Videos (sessions) per speaker; one is held out for testing.")] = 2,
    requests: Annotated[int, typer.Option(min=1, help="Deletion requests, one forget speaker each, applied in order.")] = 3,
    extract: Annotated[Optional[list[str]], typer.Option(help="QR-Erase forget extraction kinds to measure (gradient, finetune); repeat the option.")] = None,
    train_epochs: Annotated[Optional[int], typer.Option(min=1, help="Epochs of the classifier's training (default: the preset's).")] = None,
    retain_bound: Annotated[Optional[float], typer.Option(min=0, help="The rule's bound on the retain NLL's rise in nats (default: speaker 0.05, tofu 0.1, as their recipes).")] = None,
    gd_epochs: Annotated[Optional[int], typer.Option(min=1, help="GradDiff's epoch budget; it stops as soon as it meets the forget criterion (default: speaker 20, tofu its preset's).")] = None,
    gd_lr: Annotated[Optional[float], typer.Option(help="GradDiff's learning rate (default: its preset's).")] = None,
    score_retain: Annotated[int, typer.Option(min=0, help="Retain utterances the rule scores (spread over the retain set; 0: all of them), for both methods.")] = 32,
    manifests: Annotated[Optional[Path], typer.Option(help="speaker: a prepared corpus (voxceleb2 prepare / prepare-corpus output, e.g. FSDD with --forget-speakers 3) instead of the built-in one; one request per forget speaker.")] = None,
    scope: Annotated[str, typer.Option(help="speaker: weights QR-Erase edits: all, embedding, or head (class weights only, retain rank 0; scoring reuses the embeddings). GradDiff always trains every weight.")] = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write every request's row and the summary to this JSON file.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the summary as Markdown to this file.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if QR-Erase is not 10x faster per request or misses the rule.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars of training, task-vector extraction and sweeps.")] = True,
) -> None:
    """Deletion requests at service speed: time per request after the first with the retain state cached
    (QR-Erase) against GradDiff reaching the same forget criterion, the rule's measures and peak memory."""
    _set_threads(threads)
    kinds = list(extract or ["gradient", "finetune"])
    if retain_bound is None:
        retain_bound = 0.1 if dataset == "tofu" else 0.05
    if dataset == "tofu":
        if scope != "all" or manifests is not None:
            raise typer.BadParameter("--scope and --manifests apply to --dataset speaker")
        res = run_tofu(data, preset=preset, forget_split=forget_split, authors=authors,
                       extracts=list(extract or ["gradient", "lora", "finetune"]), retain_bound=retain_bound,
                       gd_epochs=gd_epochs, score_retain=score_retain or None, workdir=workdir, show=_show_request,
                       progress=progress)
    elif dataset == "speaker":
        res = rb.run_speaker(workdir, preset=preset, speakers=speakers, utterances=utterances, videos=videos,
                             requests=requests, extracts=kinds, train_epochs=train_epochs, retain_bound=retain_bound,
                             gd_epochs=gd_epochs or 20, gd_lr=gd_lr, score_retain=score_retain or None, scope=scope,
                             manifests=manifests, show=_show_request, progress=progress)
    else:
        raise typer.BadParameter(f"--dataset must be speaker or tofu, got {dataset!r}")
    ok = _print_requests_result(res, preset)
    if json_out is not None:
        rb.write_json(json_out, res)
        console.print(f"wrote {json_out}")
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(markdown_out, rb.markdown(res) + "\n")
    if strict and not ok:
        raise typer.Exit(1)
