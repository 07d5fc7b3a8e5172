"""``mmunlearn unlearn`` (any model folder a user brings, any registered method) and ``mmunlearn check-release``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mmunlearn.api.scopes import API_SCOPES
from mmunlearn.api.unlearn import unlearn as run_unlearn
from mmunlearn.config import opt
from mmunlearn.config.command import settings_command
from mmunlearn.files.undo_store import read_release_report, release_problems

console = Console()
#: `mmunlearn unlearn`'s exit status when the rule was missed (the output is written all the same).
MISSED_RULE_EXIT = 3


@dataclass(frozen=True)
class UnlearnSettings:
    """Settings of `mmunlearn unlearn` beside its options: where the undo records go, how a text LLM's rows are
    written and the forget level a text LLM's rows must reach."""

    undo: Path | None = opt(
        None,
        "Folder for the undo records (the original weights; default OUT.undo beside --out, "
        "private to you). --out never holds them.",
    )
    prompt_format: str | None = opt(
        None,
        "Text LLMs: how rows are written -- chat (the tokenizer's chat template), "
        "plain (Question: ...\\nAnswer: ...), raw (question + ' ' + answer) or a "
        "string with {question} and {answer}. Default: the chat template when the "
        "tokenizer has one, else the one of plain/raw with the lowest forget NLL "
        "(the report says which).",
    )
    forget_level: str | None = opt(
        None,
        "Text LLMs: the answer NLL every forget row must reach, in nats, or a model "
        "folder trained without the forget rows (its NLL on each row). Default: "
        "--reference's NLL on each row; without one, each row's NLL + 1 nat (a "
        "guess, the verdict says so).",
    )


def _forget_level(text: str | None) -> float | Path | None:
    """``forget_level`` as a number of nats or a model folder."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return Path(text)


def unlearn(
    model: Annotated[
        Path,
        typer.Option(
            help="Model folder of any kind: a text or speech LLM saved by save_pretrained, a SpeechBrain speaker "
            "classifier (hyperparams.yaml), a Hugging Face audio classifier."
        ),
    ],
    forget: Annotated[
        Path,
        typer.Option(
            help="What to forget: text LLMs a JSON/JSONL/CSV of question-answer rows or a .txt of texts; audio models "
            "a manifest CSV, a path,label CSV or JSON/JSONL (docs/usage.md, 'Accepted data formats')."
        ),
    ],
    retain: Annotated[
        Path,
        typer.Option(
            help="What to keep, in the same formats as --forget; a row (or, for speaker forgetting, a speaker) in "
            "both sets is refused."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Output folder: the unlearned model in its input's format plus unlearn_report.json (created; must "
            "not exist unless --overwrite)."
        ),
    ],
    method: Annotated[
        str | None,
        typer.Option(
            help="Registered method (`mmunlearn methods` lists them and the kinds each applies to). Default: the "
            "kind's (qr-erase-rows for a text LLM, a method that releases edited weights; qr-erase otherwise); "
            "the report names it."
        ),
    ] = None,
    reference: Annotated[
        Path | None,
        typer.Option(
            help="Model folder --model was fine-tuned from (same kind): erasure takes task vectors from it and an "
            "LLM's rule aims the forget NLL at its level. Never built for you."
        ),
    ] = None,
    scope: Annotated[
        str,
        typer.Option(
            help=f"Classifiers: weights erasure edits, one of {', '.join(API_SCOPES)} (sweep: the class rows first, "
            "every weight when they miss the rule)."
        ),
    ] = "sweep",
    no_rule: Annotated[
        bool,
        typer.Option(
            "--no-rule",
            help="Run the method's preset settings as they are, without the kind's sweep rule (and without the check "
            "that the model knows the forget set).",
        ),
    ] = False,
    device: Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")] = "auto",
    overwrite: Annotated[
        bool, typer.Option(help="Replace --out (and its undo folder) if mmunlearn wrote them.")
    ] = False,
    allow_missed_rule: Annotated[
        bool,
        typer.Option(
            "--allow-missed-rule",
            help=f"Exit 0 even when the rule is missed (default: exit {MISSED_RULE_EXIT} after writing --out, so a "
            "script cannot take a RULE NOT MET output for a finished one).",
        ),
    ] = False,
    settings: dict | None = None,
) -> None:
    """Unlearn --forget from the model in --model and write it to --out: the kind's rule sweeps the method, and the
    report's first line (printed) says whether the rule was met, naming each measure. Exits 3 when the rule was
    missed (the folder is still written, marked RULE NOT MET in its report) unless --allow-missed-rule."""
    given = UnlearnSettings(**(settings or {}))
    result = run_unlearn(
        model,
        forget=forget,
        retain=retain,
        method=method,
        out=out,
        reference=reference,
        scope=scope,
        undo=given.undo,
        rule=None if no_rule else "auto",
        device=device,
        overwrite=overwrite,
        prompt_format=given.prompt_format,
        forget_level=_forget_level(given.forget_level),
    )
    console.print(result.report["verdict"], markup=False)
    console.print(
        f"model written to {result.out}; undo records: {result.report.get('undo_patch', 'none')}", markup=False
    )
    if result.report.get("target_reached") is False and not allow_missed_rule:
        console.print(f"exit {MISSED_RULE_EXIT}: the rule was missed (--allow-missed-rule exits 0)", markup=False)
        raise typer.Exit(MISSED_RULE_EXIT)


def check_release(
    model: Annotated[
        Path, typer.Option(help="Model folder to check before shipping it (e.g. `mmunlearn unlearn --out`).")
    ],
) -> None:
    """Exit 1 when --model is not ready to release, naming each reason: its own report says the rule was missed; it
    is a T3 output (unchanged weights under a decoding-time filter); or it holds undo records or any other file that
    may hold the original weights (the whole folder is walked: pytorch_model.bin beside safetensors, .git, backups)."""
    problems = release_problems(model)
    report = read_release_report(model)
    verdict = report.get("verdict") if report is not None else None
    if verdict:
        console.print(f"its unlearning verdict: {verdict}", markup=False)
    if problems:
        for p in problems:
            console.print(f"NOT READY: {p}", markup=False)
        raise typer.Exit(1)
    console.print(
        f"ready to release: {model} holds no undo records and no other copy of the original weights", markup=False
    )


def mount(app: typer.Typer) -> None:
    """Add both commands to the root app."""
    settings_command(app, UnlearnSettings, ("undo", "prompt_format", "forget_level"), name="unlearn")(unlearn)
    app.command("check-release")(check_release)
