"""Typer app of the benchmarks, mounted as ``mmunlearn bench`` and runnable as ``python -m mmunlearn.bench``.

The micro-benchmarks of library pieces live here (subspace, tilt, stream, precision); a benchmark flow that builds
corpora and models (``bench requests``) is a recipe and joins this app through the entry-point group
:data:`BENCH_GROUP`, so the library never imports the recipes or data_prep."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mmunlearn.bench import precision as pb
from mmunlearn.bench import stream as stb
from mmunlearn.bench import subspace as sb
from mmunlearn.bench import tilt as tb
from mmunlearn.config import opt
from mmunlearn.config.command import mount, settings_command
from mmunlearn.errors import set_threads
from mmunlearn.files.atomic import write_json_atomic, write_text_atomic

app = typer.Typer(help="Benchmarks: print a table, optionally write JSON.", no_args_is_help=True)
console = Console()
#: entry-point group of benchmark commands defined outside the library (name -> a Typer command function)
BENCH_GROUP = "mmunlearn.bench"


def _set_threads(n: int | None) -> None:
    set_threads(n)


@app.command(context_settings={"allow_extra_args": True})
def subspace(
    ctx: typer.Context,
    sizes: Annotated[
        list[int], typer.Option(help="Matrix sizes n (n x n task matrices); repeat the option or list several values.")
    ] = [768, 1024, 2048, 4096],  # noqa: B006
    rank: Annotated[int, typer.Option(help="Subspace rank k.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed repeats per method (the median is reported).")] = 3,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write rows, checks and machine info to this JSON file.")
    ] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the table as Markdown to this file.")
    ] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if a target is missed.")] = False,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
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
    console.print(
        f"[bold]subspace benchmark[/bold] on {meta['cpu']} ({meta['threads']} threads), "
        f"torch {meta['torch']}, sizes {sizes}, k={rank}, median of {repeats}"
    )

    def show(row):
        console.print(
            f"  n={row.size:5d} {row.spectrum:8s} {row.method:12s} {row.seconds:9.4f} s "
            f"{row.speedup:8.1f}x  residual {sb.fmt_ratio(row.residual_ratio)}  cos {row.min_cosine:.4f}",
            soft_wrap=True,
        )

    rows = sb.run(sorted(sizes), rank, repeats=repeats, progress=show)
    table = Table(title=f"Subspace recovery, k = {rank}, float32")
    for col in ("n", "spectrum", "method", "time (s)", "speed-up vs SVD", "residual / optimal", "min cosine"):
        table.add_column(col, justify="left" if col in ("spectrum", "method") else "right")
    for r in rows:
        table.add_row(
            str(r.size),
            r.spectrum,
            r.method,
            f"{r.seconds:.4f}",
            f"{r.speedup:.1f}x",
            sb.fmt_ratio(r.residual_ratio),
            f"{r.min_cosine:.4f}",
        )
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
    preset: Annotated[
        str, typer.Option(help="Architecture preset of the (random-init) model: micro or mini.")
    ] = "mini",
    batch: Annotated[int, typer.Option(help="Prompts decoded together.")] = 16,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt (EOS disabled).")] = 64,
    repeats: Annotated[int, typer.Option(help="Alternating plain/tilted runs (median reported).")] = 5,
    rank: Annotated[int, typer.Option(help="Tilt head rank h.")] = 20,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result to this JSON file.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if the overhead is 15% or more.")] = False,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
) -> None:
    """T3 throughput: tilted vs plain greedy generation, tokens/s on the same prompts in one run."""
    import json

    _set_threads(threads)
    row = tb.run(preset, batch=batch, new_tokens=new_tokens, repeats=repeats, rank=rank)
    table = Table(title=f"T3 generation throughput ({preset}, batch {batch}, {new_tokens} new tokens)")
    for col in ("plain tok/s", "tilted tok/s", "overhead per token", "head params", "model params"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{row.plain_tokens_per_s:.1f}",
        f"{row.tilted_tokens_per_s:.1f}",
        f"{100 * row.overhead:+.1f}%",
        f"{row.head_parameters:,}",
        f"{row.model_parameters:,}",
    )
    console.print(table)
    ok = row.overhead < 0.15
    console.print(
        f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  token-level head costs under 15% extra "
        f"time per generated token: {100 * row.overhead:+.1f}%"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(row.to_dict(), indent=2))
    if strict and not ok:
        raise typer.Exit(1)


@app.command()
def stream(
    arch: Annotated[
        str, typer.Option(help="Tensor names and shapes of the random checkpoint: llama-3.2-1b (2.3 GiB bf16) or tiny.")
    ] = "llama-3.2-1b",
    shard_mb: Annotated[
        float, typer.Option(help="max_shard_size of the checkpoint in MB (shards split as save_pretrained does).")
    ] = 500,
    hot: Annotated[
        list[int] | None,
        typer.Option(
            help="Blocks given 4x the forget energy, i.e. the ones erased (default: three spread over the depth)."
        ),
    ] = None,
    rank: Annotated[int, typer.Option(help="Rank of the forget and retain bases.")] = 8,
    task_layers: Annotated[
        int | None, typer.Option(help="Task matrices for the first N blocks only (default: every block).")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Where the checkpoint is generated (default: the system temp dir).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the generated checkpoint, task matrices and outputs.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result to this JSON file.")] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the table as Markdown to this file.")
    ] = None,
    strict: Annotated[bool, typer.Option(help="Exit with status 1 if a target is missed.")] = False,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads in each erase process (default: torch's choice).")
    ] = None,
) -> None:
    """Streaming vs in-memory erase of a sharded random-weight checkpoint: wall time and peak RSS of
    each path (each in its own process), sizes, and a file-by-file comparison of their outputs."""
    import json

    res = stb.run(
        arch,
        shard_mb=shard_mb,
        hot=hot,
        rank=rank,
        task_layers=task_layers,
        workdir=workdir,
        keep=keep,
        threads=threads,
    )
    gb = stb.GB
    table = Table(
        title=f"Erase of a sharded {arch} checkpoint ({res.model_bytes / gb:.2f} GiB, {res.shards} shards), "
        f"rank {rank}, blocks {res.hot_layers} edited"
    )
    for col in ("path", "wall time (s)", "peak RSS (GiB)", "RSS before work (GiB)"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for r in res.rows:
        table.add_row(r.path, f"{r.seconds:.1f}", f"{r.peak_rss / gb:.2f}", f"{r.baseline_rss / gb:.2f}")
    console.print(table)
    console.print(
        f"largest shard {res.largest_shard / gb:.2f} GiB; one block's task matrices (forget + retain) "
        f"{res.layer_task_bytes / gb:.2f} GiB; all task matrices {res.task_bytes / gb:.2f} GiB; "
        f"{res.shards_rewritten} of {res.shards} shards rewritten by the streaming path, the rest hard-linked; "
        f"generating the inputs took {res.build_seconds:.0f} s"
    )
    stream_row = next(r for r in res.rows if r.path == "stream")
    checks = [
        (
            f"streaming peak RSS under {stb.TARGET} x (largest shard + one block's task matrices) = "
            f"{res.target / gb:.2f} GiB",
            stream_row.peak_rss < res.target,
            f"{stream_row.peak_rss / gb:.2f} GiB",
        ),
        ("both paths write identical files", res.identical, "identical" if res.identical else "different"),
    ]
    for name, ok, measured in checks:
        console.print(f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  {name}: {measured}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(
            json.dumps(
                {**res.to_dict(), "checks": [{"check": n, "passed": ok, "measured": m} for n, ok, m in checks]},
                indent=2,
            )
        )
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(stb.markdown(res) + "\n")
    if strict and not all(ok for _, ok, _ in checks):
        raise typer.Exit(1)


def _print_precision(res: pb.PrecisionResult, new_tokens: int, repeats: int) -> None:
    """The precision table, the ablation table and the roofline line on the console."""
    table = Table(
        title=f"{res.model}: {res.parameters / 1e6:.1f}M parameters; {res.batch} QA of {res.split} "
        f"({res.batch_tokens} tokens, {res.answer_tokens} answer tokens); up to {new_tokens} new "
        f"tokens; median of {repeats}"
    )
    for i, col in enumerate(pb.COLUMNS):
        table.add_column(col, justify="right" if 2 <= i <= 8 else "left")
    for cells in pb.table_rows(res):
        table.add_row(*cells)
    console.print(table)
    console.print("tokens: the batch's real tokens (padding excluded)")
    if res.variants:
        abl = Table(title="ablation: each speed-up alone (same rounds)")
        for i, col in enumerate(pb.VARIANT_COLUMNS):
            abl.add_column(col, justify="right" if i >= 3 else "left")
        for cells in pb.variant_rows(res):
            abl.add_row(*cells)
        console.print(abl)
    console.print(pb.roofline_line(res))


@dataclass(frozen=True)
class PrecisionSettings:
    """Settings of `bench precision` beside its options: the split, the stages and the ablation."""

    split: str = opt("forget10", "The split whose first --batch rows make the batch.")
    stage: tuple[str, ...] = opt(pb.STAGES, "Stages to run, comma-separated: train, score, generate.")
    ablation: bool = opt(
        False,
        "Also time, in the same rounds, each of the project's training and scoring speed-ups "
        "alone (packing, shared prompt prefix, fused AdamW) against its code without them.",
    )

    def __post_init__(self) -> None:
        bad = [s for s in self.stage if s not in pb.STAGES]
        if bad or not self.stage:
            raise ValueError(f"stage: unknown stage(s) {bad or '(none)'}; choose from {', '.join(pb.STAGES)}")


@settings_command(app, PrecisionSettings, ("split", "stage", "ablation"))
def precision(
    model: Annotated[
        str,
        typer.Option(
            help="A real checkpoint (smollm2-135m), a save_pretrained folder, or a random-init preset architecture "
            "(micro, mini; with a BPE trained on --data)."
        ),
    ] = "smollm2-135m",
    data: Annotated[
        str,
        typer.Option(help="QA rows: a TOFU folder (e.g. ../shared/data/tofu) or the built-in synthetic[:...] data."),
    ] = "synthetic",
    batch: Annotated[
        int,
        typer.Option(min=1, help="QA rows per batch (one training step, one scoring call, prompts decoded together)."),
    ] = 16,
    new_tokens: Annotated[
        int,
        typer.Option(
            min=1, help="Greedy tokens generated at most per question (decoding stops when every row has met EOS)."
        ),
    ] = 32,
    repeats: Annotated[
        int,
        typer.Option(
            min=1,
            help="Timed rounds over both implementations and precisions after one warm-up each (median reported).",
        ),
    ] = 3,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Also write rows, timings, checks and machine facts to this JSON file (atomic write)."
        ),
    ] = None,
    markdown_out: Annotated[
        Path | None,
        typer.Option("--markdown", help="Also write the table, goal lines and checks as Markdown to this file."),
    ] = None,
    threads: Annotated[
        int, typer.Option(min=1, help="torch CPU threads (1: measured best on a shared 2-core machine).")
    ] = 1,
    strict: Annotated[
        bool,
        typer.Option(
            help="Exit with status 1 if a mmunlearn/plain ratio is below 0.9, bf16 scoring misses its NLL bound or "
            "the two implementations disagree (the greedy-answer bound, meant for a memorised model, is reported "
            "only)."
        ),
    ] = False,
    precision_: Annotated[
        list[str] | None,
        typer.Option(
            "--precision",
            help="Precisions to run: float32, bf16 (repeat the option; default: both). On a CPU without native bf16, "
            "float32 alone keeps the run short.",
        ),
    ] = None,
    settings: dict | None = None,
) -> None:
    """Tokens/s of the project's training step, scoring and greedy generation beside a plain PyTorch +
    transformers loop, in float32 and bf16, on the same real QA batch in one run; bf16's accuracy against
    float32 and whether the project reaches 0.9x the plain loop."""
    _set_threads(threads)
    given = PrecisionSettings(**(settings or {}))
    precisions = tuple(p for p in pb.PRECISIONS if p in (precision_ or pb.PRECISIONS))
    wrong = [p for p in precision_ or () if p not in pb.PRECISIONS]
    if wrong:
        raise typer.BadParameter(
            f"unknown precision(s) {wrong}; choose from {', '.join(pb.PRECISIONS)}", param_hint="--precision"
        )
    res = pb.run(
        model,
        data=data,
        split=given.split,
        batch=batch,
        new_tokens=new_tokens,
        repeats=repeats,
        stages=given.stage,
        precisions=precisions,
        ablation=given.ablation,
        progress=lambda m: console.print(f"[dim]{m}[/dim]"),
    )
    _print_precision(res, new_tokens, repeats)
    for line in pb.goal_lines(res):
        console.print(line if "goal met" in line else f"[red]{line}[/red]")
    for c in res.checks:
        if c.kind != "goal":
            console.print(f"{'[green]PASS[/green]' if c.passed else '[red]MISS[/red]'}  {c.name}: {c.measured}")
    if res.bf16_copy_seconds is not None:
        console.print(
            f"bf16 generation copy (entering bf16_generation, once, not timed above): {res.bf16_copy_seconds:.2f} s"
        )
    console.print(pb.facts_line(res))
    if json_out is not None:
        write_json_atomic(json_out, res.to_dict())
        console.print(f"wrote {json_out}")
    if markdown_out is not None:
        write_text_atomic(markdown_out, pb.markdown(res) + "\n")
    if strict and not all(c.passed for c in res.checks if c.kind != "memorised"):
        raise typer.Exit(1)


def _mount_flows() -> None:
    """Add the benchmark commands of :data:`BENCH_GROUP` (e.g. ``requests``, from ``recipes.requests.cli``)."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=BENCH_GROUP), key=lambda e: e.name):
        mount(app, ep.name, ep.load())


_mount_flows()
