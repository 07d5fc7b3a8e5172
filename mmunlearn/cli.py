"""The ``mmunlearn`` command line: a Typer root app; recipes mount into it as sub-apps.

The console script runs :func:`main`, which shows a user error (a bad file, folder or option:
:data:`mmunlearn.errors.USER_ERRORS`) as one line ``error: <message>`` with exit status 2; ``--debug``
or ``MMUNLEARN_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

import mmunlearn
from mmunlearn.bench.cli import app as bench_app
from mmunlearn.erase.basis import METHODS
from mmunlearn.erase.options import EraseOptions
from mmunlearn.erase.energy import RULES
from mmunlearn.erase.report import LARGE_UPDATE
from mmunlearn.errors import USER_ERRORS, debug_enabled, one_line

app = typer.Typer(
    name="mmunlearn",
    help="Machine unlearning for text LLMs, speech LLMs and speaker classifiers.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")
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

    from mmunlearn.methods import REGISTRY

    for m in REGISTRY.values():
        console.print(f"[bold]{m.name}[/bold] ({', '.join(m.kinds)}): {m.help}")
        for f in fields(m.config):
            default = f.default if f.default is not MISSING else "(see presets)"
            console.print(f"    {f.name} = {m.defaults.get(f.name, default)!r}: {f.metadata.get('help', '')}")

Method = Enum("Method", {m: m for m in METHODS}, type=str)  # type: ignore[misc]
Rule = Enum("Rule", {r: r for r in RULES}, type=str)  # type: ignore[misc]
STREAM_HELP = ("Work shard by shard, one task matrix at a time (memory: about one shard plus one matrix's task "
               "matrices); --no-stream loads the whole checkpoint and task matrices. Same weights bit for bit.")
HARDLINK_HELP = ("With --stream: hard-link the shards that need no change into --out (copied when linking fails); "
                 "--no-hardlink copies them. Linked files are shared with --model: never rewrite them in place.")
_state = {"debug": False}


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error "
                                               "(also MMUNLEARN_DEBUG=1).")] = False) -> None:
    _state["debug"] = debug


def _fraction(value: Optional[float]) -> Optional[float]:
    if value is not None and not 0 < value <= 1:
        raise typer.BadParameter(f"must be in (0, 1], got {value}")
    return value


def _finite(value: Optional[float]) -> Optional[float]:
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


@app.command()
def version() -> None:
    """Print the mmunlearn version."""
    console.print(f"mmunlearn {mmunlearn.__version__}")


_EH, _ED = EraseOptions.help, EraseOptions()  # every erase option's meaning and default, declared once


@app.command()
def erase(
    model: Annotated[Path, typer.Option(help="Model directory in HF save_pretrained layout (safetensors, sharded or not).")],
    forget: Annotated[Path, typer.Option(help="Forget task matrices: a .safetensors file (parameter name -> tensor) or a directory of them.")],
    out: Annotated[Path, typer.Option(help="Directory for the edited model, undo patch, JSON report and energy plot (created; must not exist unless --overwrite).")],
    retain: Annotated[Optional[Path], typer.Option(help="Retain task matrices for the same parameters; their subspace is protected.")] = None,
    rank: Annotated[Optional[int], typer.Option(min=1, help=_EH("rank"))] = None,
    energy: Annotated[Optional[float], typer.Option(callback=_fraction, help=_EH("energy"))] = None,
    retain_rank: Annotated[Optional[int], typer.Option(min=1, help=_EH("retain_rank"))] = None,
    retain_energy: Annotated[Optional[float], typer.Option(callback=_fraction, help=_EH("retain_energy"))] = None,
    method: Annotated[Method, typer.Option(help=_EH("method"))] = _ED.method,  # type: ignore[assignment]
    scale: Annotated[float, typer.Option(callback=_finite, help=_EH("scale"))] = _ED.scale,
    localize: Annotated[bool, typer.Option(help=_EH("localize"))] = _ED.localize,
    rule: Annotated[Rule, typer.Option(help=_EH("rule"))] = _ED.rule,  # type: ignore[assignment]
    top: Annotated[Optional[int], typer.Option(min=1, help=_EH("top"))] = None,
    threshold: Annotated[Optional[float], typer.Option(callback=_finite, help=_EH("threshold"))] = None,
    rows: Annotated[bool, typer.Option(help=_EH("rows"))] = _ED.rows,
    seed: Annotated[int, typer.Option(help=_EH("seed"))] = _ED.seed,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists and is a folder mmunlearn wrote.")] = False,
    stream: Annotated[bool, typer.Option(help=STREAM_HELP)] = True,
    hardlink: Annotated[bool, typer.Option(help=HARDLINK_HELP)] = True,
) -> None:
    """Erase a forget task from a checkpoint (QR-Erase); the input checkpoint is never modified.

    --out may not be --model, inside it or above it; symbolic links leaving --model are refused.
    """
    options = dict(retain=retain, rank=rank, energy=energy, retain_rank=retain_rank, retain_energy=retain_energy,
                   method=Method(method).value, scale=scale, localize=localize, rule=Rule(rule).value, top=top,
                   threshold=threshold, rows=rows, seed=seed, overwrite=overwrite)
    if stream:
        from mmunlearn.erase.stream import stream_erase_checkpoint

        report = stream_erase_checkpoint(model, forget, out, hardlink=hardlink, **options)
    else:
        from mmunlearn.erase.in_memory import erase_checkpoint

        report = erase_checkpoint(model, forget, out, **options)
    console.print(report.table())
    console.print(f"edited model, undo patch and report written to [bold]{out}[/bold]")
    if report.large_update_layers:
        typer.echo(f"warning: update larger than {LARGE_UPDATE} x the weights (||dW||/||W||) in "
                   f"{', '.join(report.large_update_layers)}: check --scale and the task matrices", err=True)


@app.command()
def restore(
    model: Annotated[Path, typer.Option(help="Edited model folder: the output of `mmunlearn erase`, of `mmunlearn.unlearn`, or a recipe's <method>/model folder.")],
    out: Annotated[Path, typer.Option(help="Directory for the restored model (created; must not exist unless --overwrite).")],
    patch: Annotated[Optional[Path], typer.Option(help="Undo patch (default: MODEL/undo_patch.safetensors).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists.")] = False,
    stream: Annotated[bool, typer.Option(help=STREAM_HELP)] = True,
    hardlink: Annotated[bool, typer.Option(help=HARDLINK_HELP)] = True,
) -> None:
    """Undo an erase or any unlearning output: write the original weights back, bit for bit."""
    from mmunlearn.undo import restore_folder

    restore_folder(model, out, patch=patch, overwrite=overwrite, stream=stream, hardlink=hardlink)
    console.print(f"restored model written to [bold]{out}[/bold]")


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point: run the app; a user error is one line ``error: ...`` on stderr and exit 2."""
    try:
        app(args=argv, prog_name="mmunlearn")
    except USER_ERRORS as exc:
        if _state["debug"] or debug_enabled():
            raise
        typer.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
