"""``mmunlearn bench requests``: deletion requests at service speed, a benchmark flow (it builds a corpus or a TOFU
world and trains models), so it lives with the recipes and joins ``mmunlearn bench`` through the entry-point group
``mmunlearn.bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.errors import set_threads
from recipes.requests import speaker as rb
from recipes.requests.tofu import run_tofu

console = Console()


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
    set_threads(threads)
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
