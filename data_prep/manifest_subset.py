"""Smaller manifests of the same clips: every split of a manifests folder cut to at most N rows, drawn evenly over
speakers by a seed, so that a model trained on the full folder is benchmarked in less time on clips whose roles
(trained on, held out, forgotten) are unchanged.

``mmunlearn voxceleb2 subset --manifests runs/fsdd/manifests --out runs/fsdd/subset --rows 60``. The wav paths are
the source's (no audio is copied); ``subset_report.json`` names the source, the cap, the seed and each split's rows.
Re-running with the same inputs rewrites the same files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from mmunlearn.data.manifest import write_manifest
from mmunlearn.data.utterances import draw_balanced, manifest_paths, split_rows
from mmunlearn.files.atomic import write_text_atomic

REPORT = "subset_report.json"


def subset_manifests(
    manifests: str | os.PathLike, out: str | os.PathLike, rows: int, *, seed: int = 0, splits: tuple[str, ...] = ()
) -> Path:
    """Write ``out/<split>.csv`` for every split of ``manifests`` (or the named ``splits``), each at most ``rows``
    rows drawn evenly over speakers by ``seed`` (0: every row), and ``out/subset_report.json``; returns ``out``."""
    if rows < 0:
        raise ValueError(f"rows must be >= 0 (0: every row), got {rows}")
    src, out = Path(manifests), Path(out)
    paths = manifest_paths(src)
    chosen = list(splits) or sorted(paths)
    unknown = [s for s in chosen if s not in paths]
    if unknown or not chosen:
        raise FileNotFoundError(f"no manifest for split(s) {unknown or 'any'} in {src} (found: {sorted(paths)})")
    if out.resolve() == src.resolve():
        raise ValueError("--out must not be the source folder: its manifests would be overwritten")
    if out.exists() and (not out.is_dir() or out.is_symlink() or (any(out.iterdir()) and not (out / REPORT).is_file())):
        raise ValueError(
            f"--out {out} holds files this command did not write (no {REPORT}): its .csv files would be "
            "overwritten; choose a new or empty folder"
        )
    drawn = {name: draw_balanced(split_rows(src, name), rows, seed) for name in chosen}
    empty = [name for name, kept in drawn.items() if not kept]
    if empty:  # before anything is written: no half-made folder
        raise ValueError(f"split(s) {empty} of {src} are empty")
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, kept in drawn.items():
        write_manifest(out / f"{name}.csv", kept)
        counts[name] = {"rows": len(kept), "speakers": len({str(r["spk_id"]) for r in kept})}
    write_text_atomic(
        out / REPORT, json.dumps({"source": str(src), "rows": rows, "seed": seed, "counts": counts}, indent=2) + "\n"
    )
    return out


def subset_command(
    manifests: Annotated[
        Path,
        typer.Option("--manifests", help="Manifests folder to draw from (prepare / prepare-corpus); it is only read."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder of the smaller manifests (not the source).")],
    rows: Annotated[
        int, typer.Option(min=0, help="At most this many rows per split, evenly over speakers (0: every row).")
    ] = 60,
    seed: Annotated[int, typer.Option(help="Seed of the draw.")] = 0,
    splits: Annotated[str, typer.Option(help="Splits to write, comma-separated (default: every split).")] = "",
) -> None:
    """Smaller manifests of the same clips (each split cut to --rows, evenly over speakers)."""
    try:
        done = subset_manifests(
            manifests, out, rows, seed=seed, splits=tuple(s.strip() for s in splits.split(",") if s.strip())
        )
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    report = json.loads((done / REPORT).read_text())
    for name, c in report["counts"].items():
        typer.echo(f"{name:>18}: {c['rows']:5d} rows, {c['speakers']} speakers")
    typer.echo(f"wrote {done}")
