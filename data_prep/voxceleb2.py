"""VoxCeleb2 preparation: decode a VoxCeleb2 tree to 16 kHz wav, write speaker/sample-level forget/retain manifests.

Input: ``<root>/{dev,test}/aac/idNNNNN/<video>/NNNNN.m4a`` as distributed (or the same with
``.wav``/``.flac``), optionally ``vox2_meta.csv`` (adds ``gender``; it must have a ``Gender`` column
unless ``allow_no_gender``) and ``transcripts.csv`` (adds ``text``, only without segmenting). Both
side files are read and checked before any audio is decoded. Output in ``--out``::

    wav/idNNNNN/<video>/NNNNN.wav   every input not already 16 kHz mono wav/flac, converted once
    <split>.csv                     one per name in mmunlearn.data.manifest.SPLIT_NAMES
    prepare_report.json             files left out (unreadable, silent, too short) and counts
    audio_index.json                decode cache: later runs with other options decode nothing again
    prepare_stamp.json              options + input listing; the same again -> the run is skipped

Converting m4a to wav once makes training read fast (no AAC decode per epoch) and lets segments
seek. 16 kHz mono wav/flac inputs are referenced in place, never copied. Unreadable or silent files
are reported and left out; they never stop the run.

A failed run leaves no partial output: the manifests and the report are written to a temporary
folder inside ``--out`` and moved into place only once all of them are written (the stamp last).
A corrupt ``audio_index.json`` (the decode cache) stops the run with a one-line error, unless
``force``: then it is discarded and the audio decoded again.

This module holds :func:`prepare` and its command line; the steps live beside it: ``voxceleb2_inputs`` (the tree
and its side files), ``voxceleb2_decode`` (decoding, the decode cache), ``voxceleb2_manifests``
(:func:`prepare_sources`: splits, manifests, report) and ``voxceleb2_checks`` (options, shortfalls, warnings).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

import typer

from data_prep.voxceleb2_checks import (
    CATEGORY_NAME,
    FEW_SPEAKERS,
    MAX_OPTION_SECONDS,
    ShortfallError,
    check_options,
    speaker_warnings,
)
from data_prep.voxceleb2_decode import MAX_SOURCE_BYTES, MAX_SOURCE_SECONDS, SR, read_audio_index
from data_prep.voxceleb2_inputs import (
    Source,
    read_transcripts,
    read_vox_meta,
    scan_voxceleb,
)
from data_prep.voxceleb2_manifests import PrepareResult, prepare_sources
from mmunlearn.config import opt
from mmunlearn.config.command import settings_command
from mmunlearn.errors import run_app

__all__ = [
    "CATEGORY_NAME",
    "FEW_SPEAKERS",
    "FORMAT_VERSION",
    "MAX_OPTION_SECONDS",
    "MAX_SOURCE_BYTES",
    "MAX_SOURCE_SECONDS",
    "MIN_DURATION",
    "SR",
    "PREPARE_SETTINGS",
    "PrepareResult",
    "PrepareSettings",
    "ShortfallError",
    "Source",
    "app",
    "check_options",
    "echo_report",
    "main",
    "parse_forget_speakers",
    "prepare",
    "prepare_command",
    "prepare_sources",
    "read_audio_index",
    "read_transcripts",
    "read_vox_meta",
    "scan_voxceleb",
    "speaker_warnings",
]

FORMAT_VERSION = 1
#: Default of ``min_duration`` for VoxCeleb2 (its clips are >= 4 s); other corpora set their own.
MIN_DURATION = 1.0


# long: the signature (one keyword per line) and the docstring documenting them take 42 lines; the body is 23
def prepare(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    meta: str | os.PathLike | None = None,
    transcripts: str | os.PathLike | None = None,
    sets: Sequence[str] | None = None,
    speakers: int = 0,
    forget_speakers: int | Sequence[str] = 2,
    forget_fraction: float = 0.1,
    test_video_fraction: float = 0.2,
    max_utterances: int = 0,
    segment_seconds: float = 0.0,
    min_duration: float = MIN_DURATION,
    seed: int = 0,
    jobs: int = 0,
    force: bool = False,
    progress: bool = True,
    allow_no_gender: bool = False,
    allow_fewer: bool = False,
) -> PrepareResult:
    """Write the forget/retain manifests for a VoxCeleb2 tree (see the module notes).

    ``speakers``: keep this many speakers (0: all), drawn by ``seed`` (explicit forget speakers are
    always kept). ``forget_speakers``: a count drawn by ``seed`` or a list of IDs.
    ``max_utterances``: per speaker, a seeded random subset of files before decoding (0: all).
    ``min_duration`` (s): shorter files are left out (:data:`MIN_DURATION` by default, VoxCeleb2's
    clips are >= 4 s). ``allow_no_gender``: accept a meta file without a ``Gender`` column (the
    manifests then have no gender column). Returns a :class:`PrepareResult`; ``skipped`` when the
    stamp in ``out`` matches these options and inputs.

    When what was asked cannot be met -- fewer speakers than ``speakers`` (or than were found, with
    0) survive decoding and the duration filter, a speaker keeps fewer than ``max_utterances`` files,
    or a split is empty -- a :class:`ShortfallError` says what is missing and why, unless
    ``allow_fewer``: then the shortfalls are logged and listed in the report (``shortfalls``).

    Everything that can be checked without decoding (the side files, the options, the explicit
    forget speakers, the decode cache) is checked first; nothing in ``out`` changes on a failure
    except the decode cache (converted wavs and ``audio_index.json``, reused by the next run).
    """
    root, out = Path(root).resolve(), Path(out).resolve()
    if out == root:
        raise ValueError(
            f"--out {out} is the VoxCeleb2 root: the output folder must differ from --root (e.g. a folder beside it)"
        )
    meta = _default_side_file(meta, root / "vox2_meta.csv")
    transcripts = _default_side_file(transcripts, root / "transcripts.csv")
    check_options(forget_fraction, test_video_fraction, max_utterances, segment_seconds, min_duration)
    explicit = None if isinstance(forget_speakers, int) else sorted(forget_speakers)
    options = dict(
        format=FORMAT_VERSION,
        root=str(root),
        meta=str(meta),
        transcripts=str(transcripts),
        sets=sorted(sets) if sets else None,
        speakers=speakers,
        forget_speakers=explicit or forget_speakers,
        forget_fraction=forget_fraction,
        test_video_fraction=test_video_fraction,
        max_utterances=max_utterances,
        segment_seconds=segment_seconds,
        min_duration=min_duration,
        seed=seed,
        allow_fewer=allow_fewer,
    )
    # The side files first: a bad meta or transcripts file must fail now, not after hours of decoding.
    meta_recs = read_vox_meta(meta, allow_no_gender=allow_no_gender) if meta else {}
    genders = {k: r["gender"] for k, r in meta_recs.items() if "gender" in r}
    text = read_transcripts(transcripts) if transcripts and segment_seconds <= 0 else {}
    sources, dups = scan_voxceleb(root, sets, exclude=out, progress=progress)
    if not sources:
        raise FileNotFoundError(f"no audio files under {root} (expected dev/aac/idNNNNN/<video>/NNNNN.m4a)")
    return prepare_sources(
        sources,
        out,
        options=options,
        side_files=[meta, transcripts],
        genders=genders,
        text=text,
        duplicates=dups,
        genders_from=meta,
        force=force,
        jobs=jobs,
        progress=progress,
    )


def _default_side_file(given: str | os.PathLike | None, default: Path) -> Path | None:
    return Path(given).resolve() if given else (default if default.is_file() else None)


app = typer.Typer(add_completion=False, help="VoxCeleb2 forget/retain manifests.")


@app.callback()
def _root() -> None:
    """VoxCeleb2 data preparation."""


_Opt = typer.Option


@dataclass(frozen=True)
class PrepareSettings:
    """Settings of `prepare` and `prepare-corpus` beside their options: held-out videos, caps, segments, decoding
    threads and what to accept."""

    test_video_fraction: float = opt(
        0.2, "Per speaker, fraction of videos held out for the *_test splits (at least one, at most all but one)."
    )
    max_utterances: int = opt(0, "Per speaker, at most this many files, drawn by --seed before decoding (0: all).")
    segment_seconds: float = opt(
        0.0,
        "Cut each file into fixed segments of this many seconds with start/stop (e.g. 3 "
        "for long telephone utterances; 0: whole files); the audio after the last full "
        "segment is dropped and reported.",
    )
    min_duration: float | None = opt(
        None,
        f"Leave out files shorter than this (seconds; default: {MIN_DURATION} for "
        "VoxCeleb2, whose clips are >= 4 s, so only damaged ones; 0.1 for fsdd; 0 "
        "for a pattern corpus).",
    )
    jobs: int = opt(0, "Decoding threads (0: up to 4).")
    allow_no_gender: bool = opt(
        False, "prepare: accept a meta file without a Gender column (no gender column in the manifests)."
    )
    allow_fewer: bool = opt(
        False,
        "Write the manifests even when fewer speakers or utterances than asked survive "
        "(listed in prepare_report.json).",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.test_video_fraction <= 1:
            raise ValueError(f"test_video_fraction must be between 0 and 1, got {self.test_video_fraction}")
        for name in ("max_utterances", "segment_seconds", "min_duration", "jobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be at least 0, got {value}")


#: the settings of `prepare` (`prepare-corpus` takes them but allow_no_gender)
PREPARE_SETTINGS = tuple(f.name for f in fields(PrepareSettings))


@settings_command(app, PrepareSettings, PREPARE_SETTINGS, name="prepare")
def prepare_command(
    root: Annotated[
        Path,
        _Opt(
            "--root",
            help="VoxCeleb2 tree: dev/aac/idNNNNN/<video>/NNNNN.m4a (and/or test/aac/...; .wav/.flac work too).",
        ),
    ],
    out: Annotated[Path, _Opt("--out", help="Output folder: manifests, converted wavs, report.")],
    meta: Annotated[
        Path | None, _Opt(help="vox2_meta.csv (adds a gender column); default <root>/vox2_meta.csv when present.")
    ] = None,
    transcripts: Annotated[
        Path | None,
        _Opt(help="CSV with ID,text (adds a text column unless segmenting); default <root>/transcripts.csv"),
    ] = None,
    sets: Annotated[str, _Opt(help="Comma list of subsets to read: dev, test.")] = "dev,test",
    speakers: Annotated[int, _Opt(min=0, help="Keep this many speakers, by --seed (0: all).")] = 0,
    forget_speakers: Annotated[
        str, _Opt(help="Number of forget speakers drawn by --seed, or a comma list of IDs (id00012,id00015).")
    ] = "2",
    forget_fraction: Annotated[
        float,
        _Opt(
            min=0.0,
            max=0.5,
            help="Sample level: fraction of each "
            "retained speaker's training utterances to forget; as "
            "many more become the never-trained holdout.",
        ),
    ] = 0.1,
    seed: Annotated[int, _Opt(help="Seed of every random choice (speakers, splits, caps).")] = 0,
    force: Annotated[
        bool,
        _Opt(help="Rebuild even when the stamp says up to date; discard a corrupt audio_index.json (decode cache)."),
    ] = False,
    settings: dict | None = None,
) -> None:
    """Decode audio to 16 kHz wav and write speaker- and sample-level forget/retain manifests."""
    forget = parse_forget_speakers(forget_speakers)
    given = PrepareSettings(**(settings or {}))
    res = prepare(
        root,
        out,
        meta=meta,
        transcripts=transcripts,
        speakers=speakers,
        sets=[s.strip() for s in sets.split(",") if s.strip()],
        forget_speakers=forget,
        forget_fraction=forget_fraction,
        test_video_fraction=given.test_video_fraction,
        max_utterances=given.max_utterances,
        segment_seconds=given.segment_seconds,
        min_duration=MIN_DURATION if given.min_duration is None else given.min_duration,
        seed=seed,
        jobs=given.jobs,
        force=force,
        allow_no_gender=given.allow_no_gender,
        allow_fewer=given.allow_fewer,
    )
    echo_report(res)


def parse_forget_speakers(text: str) -> int | list[str]:
    """``--forget-speakers``: a count or a comma list of speaker IDs."""
    return int(text) if text.strip().isdigit() else [s.strip() for s in text.split(",") if s.strip()]


#: Per-speaker columns of the printed summary: (header, key in the report's ``per_speaker``).
_SPEAKER_COLUMNS = (
    ("files", "files"),
    ("short", "too_short"),
    ("bad", "failed"),
    ("fgt-tr", "spk_forget_train"),
    ("fgt-te", "spk_forget_test"),
    ("ret-tr", "spk_retain_train"),
    ("ret-te", "spk_retain_test"),
    ("s-fgt", "sample_forget"),
    ("s-hold", "sample_holdout"),
)


def echo_report(res: PrepareResult) -> None:
    """Print what ``prepare`` wrote: split sizes, per-speaker counts, what was left out and why."""
    rep = res.report
    min_duration = rep["options"]["min_duration"]
    typer.echo(
        f"{res.out}: {'up to date (skipped)' if res.skipped else 'written'}; forget speakers {rep['forget_speakers']}"
    )
    for name, c in rep["counts"].items():
        typer.echo(
            f"  {name + '.csv':22s} {c['utterances']:7d} utts {c['rows']:7d} rows "
            f"{c['speakers']:5d} spk {c['hours']:8.3f} h"
        )
    per_speaker = rep.get("per_speaker", {})
    if per_speaker:
        typer.echo("  per speaker: " + " ".join(f"{h:>7s}" for h, _ in _SPEAKER_COLUMNS))
        for spk, c in per_speaker.items():
            typer.echo(f"  {spk[:12]:>12s}: " + " ".join(f"{c.get(k, 0):7d}" for _, k in _SPEAKER_COLUMNS))
    for item in rep["failed"]:
        typer.echo(f"  left out (unreadable/silent): {item['path']}: {item['reason']}", err=True)
    if rep.get("speakers_without_gender"):
        typer.echo(
            f"  no gender in the meta file for {len(rep['speakers_without_gender'])} speaker(s): "
            f"{rep['speakers_without_gender'][:10]}",
            err=True,
        )
    typer.echo(
        f"  duration filter (--min-duration {min_duration} s): left out {len(rep['too_short'])} of "
        f"{rep['files_selected']} files",
        err=bool(rep["too_short"]),
    )
    for item in rep.get("shortfalls", []):
        typer.echo(f"  allowed shortfall (--allow-fewer): {item}", err=True)
    seg = rep.get("segments") or {}
    if seg.get("segment_seconds"):
        typer.echo(
            f"  segments of {seg['segment_seconds']:g} s: {seg['dropped_seconds']:.1f} s of audio dropped after "
            f"the last full segment of each file ({100 * seg['dropped_fraction']:.1f} %)"
        )
    for item in rep.get("warnings", []):
        typer.echo(f"  warning: {item}", err=True)


def main(argv: list[str] | None = None) -> None:
    """The command line: errors a user caused print as one ``error:`` line and exit 2 (as ``mmunlearn`` does)."""
    run_app(app, argv, "data_prep.voxceleb2")


if __name__ == "__main__":
    main()
