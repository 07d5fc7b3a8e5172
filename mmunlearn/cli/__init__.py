"""The ``mmunlearn`` command line: a Typer root app; recipes mount into it as sub-apps.

The console script runs :func:`main`, which shows a user error (a bad file, folder or option:
:data:`mmunlearn.errors.USER_ERRORS`) as one line ``error: <message>`` with exit status 2; ``--debug``
or ``MMUNLEARN_DEBUG=1`` shows the traceback instead. Beside it: ``unlearn.py`` (``unlearn``, ``check-release``),
``report.py`` (``report``), ``apiref.py`` (the docs' API reference page, a mkdocs hook) and ``__main__.py``
(``python -m mmunlearn.cli``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from mmunlearn._version import __version__
from mmunlearn.api.restore import restore_folder
from mmunlearn.api.unlearn import prepare_retain as prepare
from mmunlearn.audit import ATTACKS, markdown, write_audit
from mmunlearn.audit.folder import audit_folder, folder_report
from mmunlearn.audit.options import BITS, CAPABILITY_DEFAULTS, AuditOptions, options_for, parse_list
from mmunlearn.audit.table import reference_rows
from mmunlearn.bench.cli import app as bench_app
from mmunlearn.cli.report import app as report_app
from mmunlearn.cli.unlearn import mount as mount_unlearn
from mmunlearn.config import opt
from mmunlearn.config.command import settings_command
from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.options import EraseOptions
from mmunlearn.erase.report import LARGE_UPDATE
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.erase.subspace.basis import METHODS
from mmunlearn.errors import USER_ERRORS, debug_enabled, one_line, set_threads
from mmunlearn.files.layout import PATCH_NAME
from mmunlearn.files.undo_store import default_undo_dir
from mmunlearn.methods import REGISTRY
from mmunlearn.progress import is_terminal, quiet_library_bars

app = typer.Typer(
    name="mmunlearn",
    help="Machine unlearning for text LLMs, speech LLMs and speaker classifiers.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(report_app, name="report")
mount_unlearn(app)
console = Console()
#: Recipe apps are found by entry point (group ``mmunlearn.recipes`` in pyproject.toml), as plug-ins: the
#: library never imports the recipes package.
RECIPE_GROUP = "mmunlearn.recipes"


def _mount_recipes() -> None:
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=RECIPE_GROUP), key=lambda e: e.name):
        app.add_typer(ep.load(), name=ep.name)


_mount_recipes()


@app.command()
def methods() -> None:
    """List the unlearning methods, the model kinds each applies to, and their settings with help text."""
    from dataclasses import MISSING, fields

    for m in REGISTRY.values():
        console.print(f"[bold]{m.name}[/bold] ({', '.join(m.kinds)}): {m.help}")
        for f in fields(m.config):
            default = f.default if f.default is not MISSING else "(see presets)"
            console.print(f"    {f.name} = {m.defaults.get(f.name, default)!r}: {f.metadata.get('help', '')}")


Method = Enum("Method", {m: m for m in METHODS}, type=str)  # type: ignore[misc]
STREAM_HELP = (
    "Work shard by shard, one task matrix at a time (memory: about one shard plus one matrix's task "
    "matrices); --no-stream loads the whole checkpoint and task matrices. Same weights bit for bit."
)
HARDLINK_HELP = (
    "With --stream: hard-link the shards that need no change into --out (copied when linking fails); "
    "--no-hardlink copies them. Linked files are shared with --model: never rewrite them in place."
)
_state = {"debug": False}


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the full traceback of an error (also MMUNLEARN_DEBUG=1).")
    ] = False,
) -> None:
    _state["debug"] = debug


def _fraction(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 1:
        raise typer.BadParameter(f"must be in (0, 1], got {value}")
    return value


@app.command()
def version() -> None:
    """Print the mmunlearn version."""
    console.print(f"mmunlearn {__version__}")


_EH, _ED = EraseOptions.help, EraseOptions()  # every erase option's meaning and default, declared once


#: erase's settings (KEY=VALUE or --config; the fields of EraseOptions); its options are the common ones
ERASE_SETTINGS = ("retain_rank", "retain_energy", "scale", "localize", "rule", "top", "threshold", "rows", "seed")


@settings_command(app, EraseOptions, ERASE_SETTINGS)
def erase(
    model: Annotated[
        Path, typer.Option(help="Model directory in HF save_pretrained layout (safetensors, sharded or not).")
    ],
    forget: Annotated[
        Path,
        typer.Option(
            help="Forget task matrices: a .safetensors file (parameter name -> tensor) or a directory of them."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Directory for the edited model, JSON report and energy plot (created; must not exist unless "
            "--overwrite). The undo patch (the original values of every edited tensor) goes apart, to OUT.undo/ "
            "beside it (mode 0700; --overwrite replaces it too): never ship that folder."
        ),
    ],
    retain: Annotated[
        Path | None, typer.Option(help="Retain task matrices for the same parameters; their subspace is protected.")
    ] = None,
    rank: Annotated[int | None, typer.Option(min=1, help=_EH("rank"))] = None,
    energy: Annotated[float | None, typer.Option(callback=_fraction, help=_EH("energy"))] = None,
    method: Annotated[Method, typer.Option(help=_EH("method"))] = _ED.method,  # type: ignore[assignment]
    overwrite: Annotated[
        bool, typer.Option(help="Replace --out if it exists and is a folder mmunlearn wrote.")
    ] = False,
    stream: Annotated[bool, typer.Option(help=STREAM_HELP)] = True,
    hardlink: Annotated[bool, typer.Option(help=HARDLINK_HELP)] = True,
    settings: dict | None = None,
) -> None:
    """Erase a forget task from a checkpoint (QR-Erase); the input checkpoint is never modified.

    --out may not be --model, inside it or above it; symbolic links leaving --model are refused.
    """
    options = dict(
        retain=retain, rank=rank, energy=energy, method=Method(method).value, overwrite=overwrite, **(settings or {})
    )
    if stream:
        report = stream_erase_checkpoint(model, forget, out, hardlink=hardlink, **options)
    else:
        report = erase_checkpoint(model, forget, out, **options)
    console.print(report.table())
    console.print(
        f"edited model and report written to [bold]{out}[/bold]; undo patch (the original weights: do not "
        f"ship it) in [bold]{default_undo_dir(out) / PATCH_NAME}[/bold]"
    )
    if report.large_update_layers:
        typer.echo(
            f"warning: update larger than {LARGE_UPDATE} x the weights (||dW||/||W||) in "
            f"{', '.join(report.large_update_layers)}: check --scale and the task matrices",
            err=True,
        )


@app.command()
def restore(
    model: Annotated[
        Path,
        typer.Option(
            help="Edited model folder: the output of `mmunlearn erase`, of `mmunlearn.unlearn`, or a recipe's "
            "<method>/model folder."
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="Directory for the restored model (created; must not exist unless --overwrite).")
    ],
    patch: Annotated[
        Path | None,
        typer.Option(
            help="Undo patch (default: the one in the undo folder MODEL's report names, "
            "MODEL.undo/undo_patch.safetensors unless given elsewhere)."
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists.")] = False,
    stream: Annotated[bool, typer.Option(help=STREAM_HELP)] = True,
    hardlink: Annotated[bool, typer.Option(help=HARDLINK_HELP)] = True,
    steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="Deletion requests to undo for a folder edited by several (its undo_history/): 1 gives the folder "
            "the request before wrote, 0 the original model.",
        ),
    ] = 1,
) -> None:
    """Undo an erase or any unlearning output: write the original weights back, bit for bit."""
    restore_folder(model, out, patch=patch, overwrite=overwrite, stream=stream, hardlink=hardlink, steps=steps)
    console.print(f"restored model written to [bold]{out}[/bold]")


@dataclass(frozen=True)
class RetainSettings:
    """Settings of `mmunlearn prepare-retain` beside its options: a speech LLM's layers and retain questions, the
    method's preset and its task-vector extraction, a text LLM's prompt format."""

    where: str = opt("both", "Speech LLMs: layers to cover: audio, text or both.")
    retain_task: tuple[str, ...] = opt(
        ("speaker",), "Speech LLMs: spoken questions asked of the retain audio, comma-separated (speaker, gender)."
    )
    size: str | None = opt(None, "Preset of the method's config (default: the model kind's default preset).")
    extract_kind: str | None = opt(
        None, "Retain task-vector extraction: finetune, lora, gradient or layerwise (default: the preset's)."
    )
    extract_steps: int | None = opt(None, "Optimizer steps of finetune/lora extraction (default: the preset's).")
    extract_lr: float | None = opt(
        None, "Learning rate (finetune, lora) or gradient step size (default: the preset's)."
    )
    prompt_format: str | None = opt(
        None,
        "Text LLMs: how the retain rows are written, as `mmunlearn unlearn "
        "prompt_format=...`: chat, plain, raw or a string with {question} and "
        "{answer}. Default: the chat template when the tokenizer has one, else the "
        "one of plain/raw with the lowest retain NLL (give unlearn the same). A run "
        "in another format recomputes the state.",
    )

    def __post_init__(self) -> None:
        if self.extract_steps is not None and self.extract_steps < 1:
            raise ValueError(f"extract_steps must be at least 1, got {self.extract_steps}")


#: prepare-retain's settings (KEY=VALUE or --config)
RETAIN_SETTINGS = tuple(f.name for f in fields(RetainSettings))


@settings_command(app, RetainSettings, RETAIN_SETTINGS, name="prepare-retain")
def prepare_retain(
    model: Annotated[
        Path,
        typer.Option(
            help="Model folder that deletion requests will edit (a text or speech LLM's save_pretrained folder, a "
            "SpeechBrain speaker classifier)."
        ),
    ],
    retain: Annotated[
        Path,
        typer.Option(
            help="The data every request must keep, as `mmunlearn unlearn --retain`: text LLMs a JSON/JSONL/CSV of "
            "question-answer rows, speech models a manifest CSV "
            "(ID,duration,wav,start,stop,spk_id[,gender,text])."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for the retain state (created or replaced; not inside --model). Pass it to "
            "mmunlearn.unlearn(retain_state=...)."
        ),
    ],
    method: Annotated[
        str,
        typer.Option(
            help="Erasure method whose preset extraction settings are used: qr-erase, qr-erase-rows or svd-unlearn."
        ),
    ] = "qr-erase",
    reference: Annotated[
        Path | None,
        typer.Option(
            help="Model folder --model was fine-tuned from: task vectors are taken from it (default: --model)."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="Device: auto, cpu, cuda, cuda:N.")] = "auto",
    refresh: Annotated[
        bool, typer.Option(help="Recompute even if --out holds a state whose fingerprints match.")
    ] = False,
    trust_hparams: Annotated[
        bool,
        typer.Option(help="Speaker classifiers: let hyperparams.yaml run the code it names (trusted folders only)."),
    ] = False,
    scope: Annotated[
        str,
        typer.Option(
            help="Speaker classifiers: weights the requests will edit: all, embedding or head (as unlearn(scope=...))."
        ),
    ] = "all",
    settings: dict | None = None,
) -> None:
    """Compute the retain side of QR-Erase once (retain task matrices + fingerprints of the weights, the retain
    data and the settings; a text LLM's prompt format); later requests load it while the fingerprints match and
    recompute it when not."""
    given = RetainSettings(**(settings or {}))
    state = prepare(
        model,
        retain,
        out,
        method=method,
        reference=reference,
        where=given.where,
        retain_tasks=given.retain_task,
        size=given.size,
        device=device,
        refresh=refresh,
        trust_hparams=trust_hparams,
        kind=given.extract_kind,
        steps=given.extract_steps,
        lr=given.extract_lr,
        scope=scope,
        prompt_format=given.prompt_format,
    )
    how = f" ({state.reason})" if state.reason else ""
    fmt = f" in prompt format {state.meta['prompt_format']!r}" if state.meta.get("prompt_format") else ""
    console.print(
        f"retain state {state.status}{escape(how)}: {len(state.task)} task matrices from "
        f"{state.meta.get('retain_items')} retain items{escape(fmt)} in {state.seconds:.1f} s -> "
        f"[bold]{escape(str(out))}[/bold]"
    )


#: audit's settings (KEY=VALUE or --config; fields of AuditOptions), shown with the defaults of classifier kinds
AUDIT_SETTINGS = (
    "relearn_steps",
    "relearn_lr",
    "relearn_batch_size",
    "relearn_fraction",
    "relearn_on",
    "probe_folds",
    "max_new_tokens",
    "batch_size",
    "seed",
)
_AUDIT_SHOWN = {
    name: f"{getattr(AuditOptions(), name)} ("
    + "; ".join(f"{k.removeprefix('is_')}s: {v[name]}" for k, v in CAPABILITY_DEFAULTS.items() if name in v)
    + ")"
    for name in AUDIT_SETTINGS
    if any(name in v for v in CAPABILITY_DEFAULTS.values())
}


def audit_destination(out: Path | None) -> Path:
    """Where ``mmunlearn audit`` writes AUDIT.json and AUDIT.md: ``out``, else ``audit/`` in the current directory
    (not the model folder's parent: the model may lie in someone else's folder, or be a link into one)."""
    return out if out is not None else Path.cwd() / "audit"


@settings_command(app, AuditOptions, AUDIT_SETTINGS, shown=_AUDIT_SHOWN)
def audit(
    model: Annotated[
        Path,
        typer.Option(
            help="Unlearned output folder as the harness writes it (a recipe's <method>/model, `mmunlearn.unlearn`'s "
            "--out): unlearn_report.json names its method and model kind. Any other loadable model folder of a "
            "supported kind (e.g. the original model, another tool's output) is audited too, reported as 'not an "
            "mmunlearn output: no history'."
        ),
    ],
    target: Annotated[
        Path, typer.Option(help="Target model folder (trained on everything; the model that was unlearned).")
    ],
    retain_model: Annotated[
        Path,
        typer.Option(
            help="Retain model folder (never trained on the forget data: what retraining gives); speakers: the "
            "retrained classifier."
        ),
    ],
    data: Annotated[
        str,
        typer.Option(
            help="Text: a TOFU source (folder of JSON splits, 'synthetic[:...]' or a hub id). Speaker classifier or "
            "speech LLM (speaker question on the forget speakers): the prepared manifest folder."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for AUDIT.json and AUDIT.md (default: audit/ in the current directory; never beside the "
            "model, which may be someone else's folder)."
        ),
    ] = None,
    forget_split: Annotated[
        str,
        typer.Option(
            help="Text: the forget split (forget01, forget05, forget10); its _perturbed rows and holdout split are "
            "read."
        ),
    ] = "forget10",
    authors: Annotated[
        int | None, typer.Option(help="Text: keep N authors, as the run that unlearned did (tofu --authors).")
    ] = None,
    level: Annotated[
        str | None,
        typer.Option(
            help="Speaker classifier: speaker or sample (default: the level recorded in the folder's report)."
        ),
    ] = None,
    attacks: Annotated[
        str, typer.Option(help="Attacks to run, comma-separated: paraphrase, quantise, relearn, probe, or all.")
    ] = "all",
    bits: Annotated[
        str, typer.Option(help="Quantisation round trips, comma-separated bit widths: 8, 4 (GGUF Q8_0 / Q4_0).")
    ] = "8,4",
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")] = "auto",
    threads: Annotated[
        int | None,
        typer.Option(help="torch CPU threads (default: torch's choice; 1 is faster on a busy 2-core machine)."),
    ] = None,
    settings: dict | None = None,
) -> None:
    """Robustness audit of an unlearned model: does its forgetting survive paraphrase, 8/4-bit quantisation,
    relearning and a linear probe? Each attack is applied to the target, the retain model and the unlearned
    model alike; "kept" = (target - model) / (target - retain) after the attack (1 = as retrained)."""
    set_threads(threads)
    try:
        chosen = parse_list(attacks, ATTACKS, "--attacks")
        widths = parse_list(bits, BITS, "--bits", cast=int)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    for path, flag in ((model, "--model"), (target, "--target"), (retain_model, "--retain-model")):
        if not path.is_dir():
            raise typer.BadParameter(f"{path}: no such folder", param_hint=flag)
    try:
        kind = folder_report(model)["model_kind"]
        options = options_for(kind, attacks=chosen, bits=widths, **(settings or {}))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None
    result = audit_folder(
        model,
        target,
        retain_model,
        data,
        forget_split=forget_split,
        authors=authors,
        level=level,
        options=options,
        device=device,
    )
    dest = audit_destination(out)
    path = write_audit(dest, [result], {"data": data, "forget_split": forget_split, "authors": authors})
    console.print(markdown([*reference_rows(result), result["summary"]]))
    if result["white_box"].get("note"):
        console.print(result["white_box"]["note"], style="yellow", markup=False, soft_wrap=True)
    console.print(f"wrote {path} and {dest / 'AUDIT.md'}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app; a user error is one line ``error: ...`` on stderr and exit 2."""
    if not is_terminal(sys.stderr):  # a log file: no carriage-return bars from transformers / the Hub either
        quiet_library_bars()
    try:
        app(args=argv, prog_name="mmunlearn")
    except USER_ERRORS as exc:
        if _state["debug"] or debug_enabled():
            raise
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(2)
