"""Corpora with one folder or file-name pattern per speaker (FSDD and the like) into the VoxCeleb2-layout manifests.

A corpus is described by a regular expression matched against each audio file's path relative to
``--root`` (``/`` separators) with named groups:

* ``spk`` (required): the speaker ID;
* ``video`` (optional): the recording session; utterances of one session always land in the same
  split, and the ``*_test`` splits hold whole sessions the classifier never trained on;
* ``utt`` (optional): the utterance name (default: the file name without suffix).

The free spoken digit dataset (FSDD: ``recordings/{digit}_{speaker}_{take}.wav``, 6 speakers x 10
digits x 50 takes, 8 kHz) is built in (:func:`prepare_fsdd`). Its "video" is a block of consecutive
takes (``take-group``, default: takes 0-9, 10-19, ... of all ten digits), so a speaker's test
utterances are whole recording blocks of every digit: the classifier is tested on new recordings of
words it heard the speaker say. ``--video digit`` holds out whole digits instead; since the held-out
digits differ per speaker, a test clip of digit 3 then meets training clips of digit 3 only from
*other* speakers, and the word pulls the classifier towards them (a word-speaker confound that
measures word independence, not speaker identity).
Its manifests carry a ``text`` column, the digit as a word, for the speech-LLM recipe's
``--target transcript`` ("Which digit was said?" kept while "Who is speaking?" is forgotten).

Everything after scanning -- decoding to 16 kHz wav once, the duration filter, the splits, the
checks that what was asked is met (``--allow-fewer``), the per-speaker report and the stamp that
skips a re-run with the same options -- is :func:`data_prep.voxceleb2.prepare_sources`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from data_prep.voxceleb2 import (
    FORMAT_VERSION,
    PREPARE_SETTINGS,
    PrepareResult,
    PrepareSettings,
    check_options,
    echo_report,
    parse_forget_speakers,
    prepare_sources,
)
from data_prep.voxceleb2_inputs import AUDIO_SUFFIXES, Source
from mmunlearn.config.command import settings_command
from mmunlearn.errors import run_app
from mmunlearn.progress import StageBar

#: FSDD file names: ``{digit}_{speaker}_{take}.wav`` (under ``recordings/``).
FSDD_PATTERN = r"(?:.*/)?(?P<digit>\d)_(?P<spk>[A-Za-z]+)_(?P<take>\d+)\.wav"
#: FSDD's clips are 0.14-2.3 s (median 0.42 s): only empty or damaged files are shorter than this.
FSDD_MIN_DURATION = 0.1
#: FSDD's transcripts: the digit said, as a word (the ``text`` column of its manifests).
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: Takes per FSDD "video" with ``video="take-group"``.
FSDD_TAKES_PER_GROUP = 10
FSDD_VIDEOS = ("take-group", "digit")
#: Default pattern of a generic corpus: ``<speaker>/<file>`` or ``<speaker>/<session>/<file>``.
FOLDER_PATTERN = r"(?P<spk>[^/]+)/(?:(?P<video>[^/]+)/)?(?P<utt>[^/]+)\.[A-Za-z0-9]+"


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The corpus pattern, checked: ValueError unless it compiles and has a ``spk`` group."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--pattern {pattern!r} is not a regular expression: {exc}") from None
    if "spk" not in rx.groupindex:
        raise ValueError(f"--pattern {pattern!r} needs a named group (?P<spk>...) for the speaker ID")
    return rx


def scan_pattern(
    root: str | os.PathLike,
    pattern: str,
    *,
    video_of=None,
    exclude: str | os.PathLike | None = None,
    progress: bool = False,
) -> list[Source]:
    """Audio files under ``root`` whose relative path fully matches ``pattern``, as :class:`Source` records.

    ``video_of(match)``: the session of a file (default: the ``video`` group, else one session per
    speaker, which leaves that speaker without test utterances). Sorted by ID; ValueError when two
    files give the same speaker/video/utterance.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a folder")
    rx = compile_pattern(pattern)
    skip = Path(exclude).resolve() if exclude else None
    found: dict[str, Source] = {}
    for dirpath, dirnames, filenames in StageBar(os.walk(root), unit="dir", desc="scanning", disable=not progress):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            dirnames[:] = []
            continue
        dirnames.sort()
        for name in sorted(filenames):
            if Path(name).suffix.lower() not in AUDIO_SUFFIXES or name.startswith("."):
                continue
            rel = (here / name).relative_to(root).as_posix()
            m = rx.fullmatch(rel)
            if m is None or not m.group("spk"):
                continue
            groups = m.groupdict()
            video = video_of(m) if video_of else (groups.get("video") or "all")
            utt = groups.get("utt") or Path(name).stem
            try:
                st = os.stat(here / name)
            except OSError:  # vanished or dangling link
                continue
            src = Source(
                _safe(m.group("spk")), _safe(video), _safe(utt), str(here / name), "dev", st.st_size, st.st_mtime_ns
            )
            if src.id in found:
                raise ValueError(
                    f"{found[src.id].path} and {src.path} are both utterance {src.id}: the pattern "
                    "must tell every file apart (add a (?P<utt>...) group)"
                )
            found[src.id] = src
    return [found[k] for k in sorted(found)]


def _safe(name: str) -> str:
    """A speaker/video/utterance name usable as a folder name and in manifest IDs."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".")
    if not clean:
        raise ValueError(f"{name!r} gives an empty name")
    return clean


def fsdd_video(video: str):
    """The session function of FSDD files for ``video`` (``take-group`` or ``digit``)."""
    if video == "take-group":
        return lambda m: f"takes{int(m.group('take')) // FSDD_TAKES_PER_GROUP:02d}"
    if video == "digit":
        return lambda m: f"digit{m.group('digit')}"
    raise ValueError(f"FSDD video must be one of {FSDD_VIDEOS}, got {video!r}")


def prepare_corpus(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    pattern: str = FOLDER_PATTERN,
    video_of=None,
    corpus: str = "pattern",
    speakers: int = 0,
    forget_speakers: int | list[str] = 1,
    forget_fraction: float = 0.1,
    test_video_fraction: float = 0.2,
    max_utterances: int = 0,
    min_duration: float = 0.0,
    segment_seconds: float = 0.0,
    seed: int = 0,
    jobs: int = 0,
    force: bool = False,
    progress: bool = True,
    allow_fewer: bool = False,
    extra_options: dict[str, Any] | None = None,
    text_of: Callable[[Source], str] | None = None,
) -> PrepareResult:
    """Manifests for a pattern-described corpus (see the module notes; options as :func:`data_prep.voxceleb2.prepare`).

    Re-running with the same options and files is skipped; other options decode nothing again.
    ``text_of(source)``: a transcript per file (adds a ``text`` column, e.g. for the speech-LLM recipe; not with
    segments, whose words are unknown). ``segment_seconds`` > 0 cuts each file into fixed segments (a file shorter
    than one segment stays whole; the audio after the last full segment is dropped and its total reported in
    ``prepare_report.json``'s ``segments``); segments of one file stay in one split.
    """
    root, out = Path(root).resolve(), Path(out).resolve()
    check_options(forget_fraction, test_video_fraction, max_utterances, segment_seconds, min_duration)
    compile_pattern(pattern)
    explicit = None if isinstance(forget_speakers, int) else sorted(forget_speakers)
    options = dict(
        format=FORMAT_VERSION,
        corpus=corpus,
        root=str(root),
        pattern=pattern,
        speakers=speakers,
        forget_speakers=explicit or forget_speakers,
        forget_fraction=forget_fraction,
        test_video_fraction=test_video_fraction,
        max_utterances=max_utterances,
        segment_seconds=segment_seconds,
        min_duration=min_duration,
        seed=seed,
        allow_fewer=allow_fewer,
        **(extra_options or {}),
    )
    sources = scan_pattern(root, pattern, video_of=video_of, exclude=out, progress=progress)
    if not sources:
        raise FileNotFoundError(f"no audio file under {root} matches the pattern {pattern!r}")
    text = {s.id: text_of(s) for s in sources} if text_of and segment_seconds <= 0 else None  # a word per file
    return prepare_sources(sources, out, options=options, text=text, force=force, jobs=jobs, progress=progress)


def prepare_fsdd(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    video: str = "take-group",
    min_duration: float = FSDD_MIN_DURATION,
    forget_speakers: int | list[str] = 1,
    **kwargs: Any,
) -> PrepareResult:
    """FSDD manifests: speaker = FSDD's speaker name, "video" = ``video`` (see the module notes); other options
    as :func:`prepare_corpus`. ``root`` is FSDD's folder (holding ``recordings/``)."""
    return prepare_corpus(
        root,
        out,
        pattern=FSDD_PATTERN,
        video_of=fsdd_video(video),
        corpus="fsdd",
        min_duration=min_duration,
        forget_speakers=forget_speakers,
        extra_options={"video": video, "text": "digit words"},
        text_of=fsdd_text,
        **kwargs,
    )


def fsdd_text(source: Source) -> str:
    """The transcript of an FSDD clip: its digit as a word (``3_theo_12`` -> ``three``)."""
    return DIGIT_WORDS[int(source.utt.split("_")[0])]


_Opt = typer.Option


def prepare_corpus_command(
    root: Annotated[Path, _Opt("--root", help="Corpus folder (FSDD: the folder holding recordings/).")],
    out: Annotated[Path, _Opt("--out", help="Output folder: manifests, converted 16 kHz wavs, report.")],
    corpus: Annotated[
        str,
        _Opt(help="fsdd (free spoken digit dataset, built-in pattern) or pattern (any corpus described by --pattern)."),
    ] = "fsdd",
    pattern: Annotated[
        str | None,
        _Opt(
            help="With --corpus pattern: regular expression on each file's path "
            "relative to --root, with groups (?P<spk>..), optional (?P<video>..) "
            "and (?P<utt>..); default: <speaker>/[<session>/]<file>."
        ),
    ] = None,
    video: Annotated[
        str,
        _Opt(
            help="With --corpus fsdd: what a held-out 'video' is: take-group (blocks of 10 "
            "takes of every digit) or digit (whole digits)."
        ),
    ] = "take-group",
    speakers: Annotated[int, _Opt(min=0, help="Keep this many speakers, by --seed (0: all).")] = 0,
    forget_speakers: Annotated[
        str, _Opt(help="Number of forget speakers drawn by --seed, or a comma list of IDs (e.g. theo).")
    ] = "1",
    forget_fraction: Annotated[
        float,
        _Opt(
            min=0.0,
            max=0.5,
            help="Sample level: fraction of each retained "
            "speaker's training utterances to forget; as many more become the "
            "never-trained holdout.",
        ),
    ] = 0.1,
    seed: Annotated[int, _Opt(help="Seed of every random choice (speakers, splits, caps).")] = 0,
    force: Annotated[bool, _Opt(help="Rebuild even when the stamp says up to date.")] = False,
    settings: dict | None = None,
) -> None:
    """Manifests (VoxCeleb2 layout) for FSDD or any corpus with one folder or file-name pattern per speaker."""
    given = PrepareSettings(**(settings or {}))
    min_duration = given.min_duration
    common = dict(
        speakers=speakers,
        forget_speakers=parse_forget_speakers(forget_speakers),
        forget_fraction=forget_fraction,
        test_video_fraction=given.test_video_fraction,
        max_utterances=given.max_utterances,
        seed=seed,
        jobs=given.jobs,
        force=force,
        allow_fewer=given.allow_fewer,
        segment_seconds=given.segment_seconds,
    )
    if corpus == "fsdd":
        if pattern is not None:
            raise typer.BadParameter("--pattern is for --corpus pattern (FSDD's is built in)")
        res = prepare_fsdd(
            root, out, video=video, min_duration=FSDD_MIN_DURATION if min_duration is None else min_duration, **common
        )
    elif corpus == "pattern":
        res = prepare_corpus(root, out, pattern=pattern or FOLDER_PATTERN, min_duration=min_duration or 0.0, **common)
    else:
        raise typer.BadParameter(f"--corpus must be fsdd or pattern, got {corpus!r}")
    echo_report(res)


app = typer.Typer(add_completion=False, help="Manifests for FSDD or a one-folder-per-speaker corpus.")
prepare_corpus_command = settings_command(
    app, PrepareSettings, [k for k in PREPARE_SETTINGS if k != "allow_no_gender"], name="prepare"
)(prepare_corpus_command)


def main(argv: list[str] | None = None) -> None:
    """The command line: errors a user caused print as one ``error:`` line and exit 2 (as ``mmunlearn`` does)."""
    run_app(app, argv, "python -m data_prep.fsdd")


if __name__ == "__main__":
    main()
