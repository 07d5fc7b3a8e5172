"""``mmunlearn unlearn`` (any model folder a user brings, any registered method) and ``mmunlearn check-release``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from mmunlearn.api import unlearn as run_unlearn
from mmunlearn.undo_store import release_problems
from mmunlearn.unlearn_scopes import API_SCOPES

console = Console()


def unlearn(
    model: Annotated[Path, typer.Option(help="Model folder of any kind: a text or speech LLM saved by save_pretrained, a SpeechBrain speaker classifier (hyperparams.yaml), a Hugging Face audio classifier.")],
    forget: Annotated[Path, typer.Option(help="What to forget: text LLMs a JSON/JSONL/CSV of question-answer rows or a .txt of texts; audio models a manifest CSV, a path,label CSV or JSON/JSONL (docs/usage.md, 'Accepted data formats').")],
    retain: Annotated[Path, typer.Option(help="What to keep, in the same formats as --forget; a row (or, for speaker forgetting, a speaker) in both sets is refused.")],
    out: Annotated[Path, typer.Option(help="Output folder: the unlearned model in its input's format plus unlearn_report.json (created; must not exist unless --overwrite).")],
    method: Annotated[str, typer.Option(help="Registered method (`mmunlearn methods` lists them and the kinds each applies to).")] = "qr-erase",
    reference: Annotated[Optional[Path], typer.Option(help="Model folder --model was fine-tuned from (same kind): erasure takes task vectors from it and an LLM's rule aims the forget NLL at its level. Never built for you.")] = None,
    scope: Annotated[str, typer.Option(help=f"Classifiers: weights erasure edits, one of {', '.join(API_SCOPES)} (sweep: the class rows first, every weight when they miss the rule).")] = "sweep",
    undo: Annotated[Optional[Path], typer.Option(help="Folder for the undo records (the original weights; default OUT.undo beside --out, private to you). --out never holds them.")] = None,
    no_rule: Annotated[bool, typer.Option("--no-rule", help="Run the method's preset settings as they are, without the kind's sweep rule (and without the check that the model knows the forget set).")] = False,
    device: Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")] = "auto",
    overwrite: Annotated[bool, typer.Option(help="Replace --out (and its undo folder) if mmunlearn wrote them.")] = False,
) -> None:
    """Unlearn --forget from the model in --model and write it to --out: the kind's rule sweeps the method, and the
    report's first line (printed) says whether the rule was met, naming each measure."""
    result = run_unlearn(model, forget=forget, retain=retain, method=method, out=out, reference=reference,
                         scope=scope, undo=undo, rule=None if no_rule else "auto", device=device,
                         overwrite=overwrite)
    console.print(result.report["verdict"], markup=False)
    console.print(f"model written to {result.out}; undo records: {result.report.get('undo_patch', 'none')}",
                  markup=False)


def check_release(
    model: Annotated[Path, typer.Option(help="Model folder to check before shipping it (e.g. `mmunlearn unlearn --out`).")],
) -> None:
    """Exit 1 when --model is not ready to release: it holds undo records (the original weights of what was edited)."""
    problems = release_problems(model)
    report = model / "unlearn_report.json"
    if report.is_file():
        verdict = json.loads(report.read_text()).get("verdict")
        if verdict:
            console.print(f"its unlearning verdict: {verdict}", markup=False)
    if problems:
        for p in problems:
            console.print(f"NOT READY: {p}", markup=False)
        raise typer.Exit(1)
    console.print(f"ready to release: {model} holds no undo records", markup=False)


def mount(app: typer.Typer) -> None:
    """Add both commands to the root app."""
    app.command("unlearn")(unlearn)
    app.command("check-release")(check_release)
