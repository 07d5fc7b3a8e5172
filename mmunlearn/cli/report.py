"""``mmunlearn report``: record a run's JSON for the docs, and regenerate or check the docs' result tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mmunlearn import report

app = typer.Typer(
    help="Results that can be traced: record a run's JSON under docs/results/, regenerate the "
    "docs' tables from those records, or check that pages and records agree.",
    no_args_is_help=True,
)
console = Console()
Results = Annotated[Path, typer.Option(help="Folder of the results records.")]
Docs = Annotated[
    Path,
    typer.Option(
        help="Folder of the Markdown pages whose marked tables are generated (and README.md beside it when present)."
    ),
]


def _pages(docs: Path) -> list[Path]:
    pages = sorted(docs.rglob("*.md")) if docs.is_dir() else []
    readme = docs.parent / "README.md"
    return pages + ([readme] if readme.is_file() else [])


@app.command()
def record(
    run: Annotated[
        Path, typer.Argument(help="The run's JSON, or its folder (compare.json / run.json / results.json).")
    ],
    name: Annotated[str, typer.Option(help="Record name: docs/results/NAME.json, and what a page's marker names.")],
    command: Annotated[str, typer.Option(help="The exact command that produced the run (kept with the figures).")],
    title: Annotated[str, typer.Option(help="One line saying what the table shows.")] = "",
    rows_key: Annotated[str, typer.Option(help="Key of the row list in the run's JSON.")] = "rows",
    columns: Annotated[
        str | None,
        typer.Option(
            help="Columns as 'header=key,header=key' (default: the run's "
            "own 'columns', else every key of its first row)."
        ),
    ] = None,
    commit: Annotated[
        str | None, typer.Option(help="The commit the run was made at (default: the checked-out one).")
    ] = None,
    date: Annotated[str | None, typer.Option(help="When the run was made (default: now).")] = None,
    recipe_config: Annotated[
        str | None,
        typer.Option(
            help="The shipped recipe config (benchmark/name) whose `--config` command has the run's settings."
        ),
    ] = None,
    out: Results = Path("docs/results"),
) -> None:
    """Copy a run's rows and columns into a record with the command, date, commit and machine facts."""
    cols = None
    if columns is not None:
        pairs = [c.split("=", 1) for c in columns.split(",") if c.strip()]
        if not pairs or any(len(p) != 2 or not p[0].strip() or not p[1].strip() for p in pairs):
            raise typer.BadParameter(f"expected 'header=key,header=key', got {columns!r}", param_hint="--columns")
        cols = [[h.strip(), k.strip()] for h, k in pairs]
    try:
        rec = report.make_record(
            report.load_source(run),
            name=name,
            command=command,
            title=title,
            rows_key=rows_key,
            columns=cols,
            commit=commit,
            date=date,
            config=recipe_config,
        )
    except ValueError as e:
        raise ValueError(e if str(run) in str(e) else f"{run}: {e}") from None  # the error names the file
    path = report.write_record(rec, out)
    console.print(report.render(rec), markup=False, soft_wrap=True)
    console.print(f"recorded in {path}")


@app.command()
def render(record_json: Annotated[Path, typer.Argument(help="A results record (docs/results/NAME.json).")]) -> None:
    """Print a record's Markdown table."""
    try:
        table = report.render(report.load_source(record_json))
    except ValueError as e:
        raise ValueError(e if str(record_json) in str(e) else f"{record_json}: {e}") from None
    console.print(table, markup=False, soft_wrap=True)


@app.command()
def update(docs: Docs = Path("docs"), results: Results = Path("docs/results")) -> None:
    """Rewrite every marked table of the pages from its record."""
    changed = report.update_pages(_pages(docs), results)
    console.print(f"updated {len(changed)} page(s)" + (": " + ", ".join(changed) if changed else ""))


@app.command()
def check(
    docs: Docs = Path("docs"),
    results: Results = Path("docs/results"),
    quiet: Annotated[bool | None, typer.Option(help="Print nothing when every table agrees.")] = False,
) -> None:
    """Exit 1 when a marked table differs from what its record gives."""
    stale = report.stale_blocks(_pages(docs), results)
    if stale:
        console.print(
            "tables that differ from their records (run `mmunlearn report update`):\n  " + "\n  ".join(stale),
            markup=False,
        )
        raise typer.Exit(1)
    if not quiet:
        console.print("every marked table agrees with its record")
