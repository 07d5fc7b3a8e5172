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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import soundfile as sf
import typer
from tqdm import tqdm

from data_prep.voxceleb2_inputs import (
    Source,
    read_transcripts,
    read_vox_meta,
    scan_voxceleb,
)
from mmunlearn.atomic import write_text_atomic
from mmunlearn.data.audio import AudioError, read_audio, save_wav
from mmunlearn.data.manifest import (
    SPLIT_NAMES,
    Utterance,
    choose_forget_speakers,
    make_splits,
    segment_rows,
    select_speakers,
    write_manifest,
)
from mmunlearn.errors import run_app

log = logging.getLogger(__name__)

SR = 16000
FORMAT_VERSION = 1
#: Default of ``min_duration`` for VoxCeleb2 (its clips are >= 4 s); other corpora set their own.
MIN_DURATION = 1.0
#: Longest segment or shortest-file bound an option may ask for (seconds): an hour
MAX_OPTION_SECONDS = 3600.0
#: A source file larger than this, or longer than :data:`MAX_SOURCE_SECONDS`, is left out unread (reported like an
#: unreadable one) instead of being decoded into memory: a 4 GiB (sparse) wav header is not a recording of a speaker
MAX_SOURCE_BYTES = 2 << 30
MAX_SOURCE_SECONDS = 2 * 3600
@dataclass
class PrepareResult:
    """What :func:`prepare` produced: the manifest paths, the report, and whether it was skipped."""

    out: Path
    manifests: dict[str, Path]
    report: dict[str, Any]
    skipped: bool = False


def _info(path: str) -> Any:
    """``sf.info`` of a wav/flac, None when its header does not read (decoding then says what is wrong)."""
    try:
        return sf.info(path)
    except RuntimeError:
        return None


def _convert_one(src: Source, wav_dir: Path, cached: dict | None) -> dict:
    """Decode/validate one file; returns its index entry (``wav`` + ``frames``, or ``error``)."""
    key = {"size": src.size, "mtime_ns": src.mtime_ns}
    if cached and all(cached.get(k) == v for k, v in key.items()) and (
        "error" in cached or Path(cached.get("wav", "")).is_file()
    ):
        return cached
    try:
        suffix = Path(src.path).suffix.lower()
        info = _info(src.path) if suffix in (".wav", ".flac") else None
        seconds = info.frames / max(info.samplerate, 1) if info is not None else 0.0
        if src.size > MAX_SOURCE_BYTES or seconds > MAX_SOURCE_SECONDS:
            raise ValueError(f"{src.path}: {src.size:,} bytes, {seconds:.0f} s: larger than {MAX_SOURCE_BYTES >> 30} "
                             f"GiB or longer than {MAX_SOURCE_SECONDS} s, left out undecoded")
        wav = read_audio(src.path, SR)
        if info is not None and info.samplerate == SR and info.channels == 1:
            return {**key, "wav": src.path, "frames": int(wav.size)}
        dst = wav_dir / src.spk_id / src.video / f"{src.utt}.wav"
        save_wav(dst, wav, SR)
        return {**key, "wav": str(dst), "frames": int(wav.size)}
    except (AudioError, RuntimeError, ValueError) as exc:  # unreadable/silent/empty: report, go on
        return {**key, "error": str(exc)}


def _options_digest(options: dict, sources: list[Source], side_files: Sequence[Path | None]) -> str:
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for path in side_files:  # meta / transcripts: their content matters too
        if path is not None:
            h.update(hashlib.sha256(path.read_bytes()).digest())
    for s in sources:
        h.update(f"{s.path}\0{s.size}\0{s.mtime_ns}\n".encode())
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON (indent 1, keys sorted) to ``path``, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def _index_entry_ok(entry: Any) -> bool:
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), int) for k in ("size", "mtime_ns")):
        return False
    if "error" in entry:
        return isinstance(entry["error"], str)
    return isinstance(entry.get("wav"), str) and isinstance(entry.get("frames"), int)


def read_audio_index(path: Path, force: bool = False) -> dict[str, dict]:
    """The decode cache ``audio_index.json`` (``{}`` when absent).

    A file that is not a JSON object is corrupt: a one-line ValueError saying to use ``--force``,
    or with ``force`` it is discarded (with a warning) and every file is decoded again. Entries of
    the wrong shape are dropped: those files are decoded again.
    """
    if not path.is_file():
        return {}
    problem = None
    try:
        index = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"not valid JSON: {exc}"
    else:
        if not isinstance(index, dict):
            problem = f"expected a JSON object of file entries, got {type(index).__name__}"
    if problem is not None:
        if not force:
            raise ValueError(f"{path} is corrupt ({problem}); rerun with --force to discard it and decode "
                             "the audio again")
        log.warning("%s is corrupt (%s): discarded, decoding the audio again", path, problem)
        return {}
    return {k: v for k, v in index.items() if _index_entry_ok(v)}


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
        raise ValueError(f"--out {out} is the VoxCeleb2 root: the output folder must differ from --root "
                         "(e.g. a folder beside it)")
    meta = _default_side_file(meta, root / "vox2_meta.csv")
    transcripts = _default_side_file(transcripts, root / "transcripts.csv")
    check_options(forget_fraction, test_video_fraction, max_utterances, segment_seconds, min_duration)
    explicit = None if isinstance(forget_speakers, int) else sorted(forget_speakers)
    options = dict(format=FORMAT_VERSION, root=str(root), meta=str(meta),
                   transcripts=str(transcripts), sets=sorted(sets) if sets else None,
                   speakers=speakers, forget_speakers=explicit or forget_speakers,
                   forget_fraction=forget_fraction, test_video_fraction=test_video_fraction,
                   max_utterances=max_utterances, segment_seconds=segment_seconds,
                   min_duration=min_duration, seed=seed, allow_fewer=allow_fewer)
    # The side files first: a bad meta or transcripts file must fail now, not after hours of decoding.
    meta_recs = read_vox_meta(meta, allow_no_gender=allow_no_gender) if meta else {}
    genders = {k: r["gender"] for k, r in meta_recs.items() if "gender" in r}
    text = read_transcripts(transcripts) if transcripts and segment_seconds <= 0 else {}
    sources, dups = scan_voxceleb(root, sets, exclude=out, progress=progress)
    if not sources:
        raise FileNotFoundError(f"no audio files under {root} "
                                "(expected dev/aac/idNNNNN/<video>/NNNNN.m4a)")
    return prepare_sources(sources, out, options=options, side_files=[meta, transcripts], genders=genders,
                           text=text, duplicates=dups, genders_from=meta, force=force, jobs=jobs,
                           progress=progress)


def check_options(forget_fraction: float, test_video_fraction: float, max_utterances: int,
                  segment_seconds: float, min_duration: float) -> None:
    """ValueError for split or filter options out of range (before anything is read)."""
    if segment_seconds < 0 or min_duration < 0 or max_utterances < 0:
        raise ValueError("segment_seconds, min_duration and max_utterances must be >= 0")
    for name, value in (("--segment-seconds", segment_seconds), ("--min-duration", min_duration)):
        if not value <= MAX_OPTION_SECONDS:  # inf, 1e308 and NaN included
            raise ValueError(f"{name} must be a number of seconds up to {MAX_OPTION_SECONDS:g}, got {value!r}")
    if not 0.0 <= forget_fraction <= 0.5 or not 0.0 < test_video_fraction < 1.0:
        raise ValueError(f"forget_fraction must be in [0, 0.5] and test_video_fraction in (0, 1), got "
                         f"{forget_fraction} and {test_video_fraction}")


def prepare_sources(
    sources: Sequence[Source],
    out: str | os.PathLike,
    *,
    options: dict[str, Any],
    side_files: Sequence[Path | None] = (),
    genders: dict[str, str] | None = None,
    text: dict[str, str] | None = None,
    duplicates: int = 0,
    genders_from: Path | None = None,
    force: bool = False,
    jobs: int = 0,
    progress: bool = True,
) -> PrepareResult:
    """Decode ``sources`` (any corpus's files as :class:`Source` records) and write the manifests to ``out``.

    ``options`` must hold ``speakers``, ``forget_speakers``, ``forget_fraction``,
    ``test_video_fraction``, ``max_utterances``, ``segment_seconds``, ``min_duration``, ``seed``
    and ``allow_fewer`` (see :func:`prepare`); all of it, with the sources and the ``side_files``'
    content, makes the stamp: the same again skips the run. ``genders``: speaker -> gender (adds a
    gender column); ``text``: utterance ID -> transcript (adds a text column).
    """
    out = Path(out).resolve()
    genders, text = genders or {}, text or {}
    speakers, forget_speakers = options["speakers"], options["forget_speakers"]
    explicit = None if isinstance(forget_speakers, int) else sorted(forget_speakers)
    min_duration, seed = options["min_duration"], options["seed"]
    digest = _options_digest(options, list(sources), side_files)
    stamp_path, report_path = out / "prepare_stamp.json", out / "prepare_report.json"
    manifests = {name: out / f"{name}.csv" for name in SPLIT_NAMES}
    done = [stamp_path, report_path, *manifests.values()]
    if not force and all(p.is_file() for p in done):
        try:
            stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            stamp = report = None  # a damaged stamp or report: rebuild
        if isinstance(stamp, dict) and isinstance(report, dict) and stamp.get("digest") == digest:
            return PrepareResult(out, manifests, report, skipped=True)

    todo = _select_files(list(sources), speakers, explicit or [], options["max_utterances"], seed)  # unknown IDs fail here
    selected = sorted({s.spk_id for s in todo})
    choose_forget_speakers(selected, explicit or forget_speakers, seed)  # count fits?
    index = read_audio_index(out / "audio_index.json", force=force)
    out.mkdir(parents=True, exist_ok=True)
    entries = _decode_all(todo, out, jobs, progress, index)
    utts, failed, too_short = _utterances(todo, entries, int(round(min_duration * SR)),
                                          {k: {"gender": g} for k, g in genders.items()}, text)
    kept = sorted({u.spk_id for u in utts})
    found = len({s.spk_id for s in sources})
    wanted = min(speakers, found) if speakers > 0 else found
    shortfalls = [f"{speakers} speakers asked for, {found} found"] if speakers > found else []
    lost = [s for s in selected if s not in kept]
    if lost or len(kept) < wanted:
        shortfalls.append(f"{len(kept)} of {wanted} speakers left after decoding and the duration filter "
                          f"(every file of {lost[:10]} was unreadable or shorter than {min_duration} s)")
    if len(kept) < 2 or (isinstance(forget_speakers, int) and forget_speakers >= len(kept)):
        raise ShortfallError(f"{len(kept)} speaker(s) left after decoding and the duration filter "
                             f"({len(too_short)} file(s) shorter than {min_duration} s, {len(failed)} unreadable): "
                             f"too few to forget {forget_speakers} and keep one; lower --min-duration")
    forget = choose_forget_speakers(kept, explicit or forget_speakers, seed)
    splits, info = make_splits(utts, forget, options["forget_fraction"], options["test_video_fraction"], seed)
    per_speaker = _per_speaker(splits, todo, too_short, failed)
    shortfalls += _split_shortfalls(splits, per_speaker, options)
    if shortfalls:
        hint = (f"; {len(too_short)} file(s) were shorter than --min-duration {min_duration} s" if too_short else "")
        if not options.get("allow_fewer"):
            raise ShortfallError("cannot prepare what was asked: " + "; ".join(shortfalls) + hint +
                                 ". Pass --allow-fewer (allow_fewer=True) to write the manifests anyway")
        for item in shortfalls:
            log.warning("allowed shortfall: %s", item)
    no_gender = sorted(s for s in kept if not genders.get(s)) if genders else []
    if no_gender:
        log.warning("%s gives no gender for %d kept speaker(s): %s", genders_from, len(no_gender), no_gender[:10])

    # Written beside the final files, then moved into place; the old stamp goes first, the new one last.
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".prepare-tmp-"))
    try:
        counts = {}
        for name, items in splits.items():
            rows = [r for u in items for r in segment_rows(u, SR, options["segment_seconds"])]
            write_manifest(staging / manifests[name].name, rows, columns=_columns(utts))
            kept_seconds = sum(r["duration"] for r in rows)
            counts[name] = {"utterances": len(items), "rows": len(rows),
                            "speakers": len({u.spk_id for u in items}),
                            "hours": round(kept_seconds / 3600, 4),
                            "dropped_seconds": round(sum(u.frames for u in items) / SR - kept_seconds, 3)}
        audio_seconds = sum(u.frames for u in utts) / SR
        dropped = counts["train"]["dropped_seconds"] + sum(
            counts[n]["dropped_seconds"] for n in ("spk_forget_test", "spk_retain_test", "sample_holdout"))
        holdout_out = len(splits.get("sample_holdout", []))
        for item in speaker_warnings(kept):
            log.warning("%s", item)
        report = {"options": options, "files_found": len(sources), "duplicates": duplicates,
                  "files_selected": len(todo), "failed": failed, "too_short": too_short,
                  "forget_speakers": forget, "retain_speakers": [s for s in kept if s not in forget],
                  "speakers_without_gender": no_gender, "counts": counts, "per_speaker": per_speaker,
                  "shortfalls": shortfalls, "warnings": speaker_warnings(kept),
                  "segments": {"segment_seconds": options["segment_seconds"],
                               "dropped_seconds": round(dropped, 3),
                               "dropped_fraction": round(dropped / audio_seconds, 4) if audio_seconds else 0.0},
                  "original_training": {
                      "utterances": len(splits["train"]),
                      "depends_on_forget_speakers": holdout_out > 0,
                      "note": "train = the forget speakers' training utterances + the retained speakers' minus "
                              f"their sample-level holdout ({holdout_out} utterances), which is drawn from retained "
                              "speakers only: another --forget-speakers gives the original model another training "
                              "set (all of a speaker's training utterances when it is forgotten, all but its "
                              "holdout when it is kept)"},
                  **info}
        _write_json(staging / report_path.name, report)
        stamp_path.unlink(missing_ok=True)  # an interrupted move must not look finished
        for path in [*manifests.values(), report_path]:
            os.replace(staging / path.name, path)
        _write_json(stamp_path, {"digest": digest, "options": options})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PrepareResult(out, manifests, report)


#: Folder names that name a category of recordings rather than a person (checked case-insensitively).
CATEGORY_NAME = re.compile(r"(?i)^(fe)?male|(^|[_-])(audio|audios|wavs?|clips?|recordings?|speech|data|train|test|dev|"
                           r"eval|valid|samples?|files?|speakers?|voices?|men|women|adults?|children|kids)([_-]|$)")
#: Fewer speakers than this draw a warning: a speaker benchmark with so few classes is rarely what was meant.
FEW_SPEAKERS = 5


def speaker_warnings(speakers: Sequence[str]) -> list[str]:
    """Warnings about the speakers a pattern found: too few of them, or names that look like category folders
    (``female_audio``, ``male``, ``train``) rather than people -- usually a pattern one folder level off."""
    out = []
    if len(speakers) < FEW_SPEAKERS:
        out.append(f"only {len(speakers)} speaker(s) found ({', '.join(list(speakers)[:10])}); check that the "
                   "pattern's (?P<spk>...) group matches a per-speaker folder or file-name part")
    looks = [s for s in speakers if CATEGORY_NAME.search(s)]
    if looks:
        out.append(f"speaker name(s) {looks[:10]} look like category folders, not people; the speaker is probably "
                   "one level deeper (e.g. --pattern '[^/]+/(?P<spk>[^/]+)/(?P<utt>[^/]+)\\.wav')")
    return out


class ShortfallError(ValueError):
    """``prepare`` cannot give the speakers or utterances asked for (``--allow-fewer`` writes what there is)."""


#: Splits that may be empty without a shortfall when the options ask for no such utterances.
_SAMPLE_SPLITS = ("sample_forget", "sample_holdout")


def _per_speaker(splits: dict[str, list[Utterance]], todo: list[Source], too_short: list[dict],
                 failed: list[dict]) -> dict[str, dict[str, int]]:
    """Per speaker: files selected, left out (too short / unreadable) and utterances in each split."""
    by_path = {s.path: s.spk_id for s in todo}
    table: dict[str, dict[str, int]] = {}
    for src in todo:
        row = table.setdefault(src.spk_id, {"files": 0, "too_short": 0, "failed": 0})
        row["files"] += 1
    for what, items in (("too_short", too_short), ("failed", failed)):
        for item in items:
            table[by_path[item["path"]]][what] += 1
    for name in ("spk_forget_train", "spk_forget_test", "spk_retain_train", "spk_retain_test",
                 "sample_forget", "sample_holdout"):
        for u in splits[name]:
            table[u.spk_id][name] = table[u.spk_id].get(name, 0) + 1
    return dict(sorted(table.items()))


def _split_shortfalls(splits: dict[str, list[Utterance]], per_speaker: dict[str, dict[str, int]],
                      options: dict[str, Any]) -> list[str]:
    """What the options asked for and the kept utterances do not give."""
    found = []
    cap = options["max_utterances"]
    if cap:
        short = {s: c["files"] - c["too_short"] - c["failed"] for s, c in per_speaker.items()}
        short = {s: n for s, n in short.items() if n < cap}
        if short:
            found.append(f"{len(short)} speaker(s) have fewer than --max-utterances {cap} usable files: "
                         + ", ".join(f"{s} {n}" for s, n in list(short.items())[:10]))
    for name, items in splits.items():
        if items or (name in _SAMPLE_SPLITS and options["forget_fraction"] == 0):
            continue
        found.append(f"split {name} is empty")
    no_test = [s for s, c in per_speaker.items()
               if c["files"] > c["too_short"] + c["failed"]
               and not c.get("spk_forget_test") and not c.get("spk_retain_test")]
    if no_test:
        found.append(f"{len(no_test)} speaker(s) have a single video, so no held-out test utterances: {no_test[:10]}")
    return found


def _default_side_file(given: str | os.PathLike | None, default: Path) -> Path | None:
    return Path(given).resolve() if given else (default if default.is_file() else None)


def _select_files(sources: list[Source], speakers: int, keep: list[str], max_utterances: int,
                  seed: int) -> list[Source]:
    """The files to decode: the chosen speakers', capped per speaker by a seeded draw."""
    by_spk: dict[str, list[Source]] = {}
    for src in sources:
        by_spk.setdefault(src.spk_id, []).append(src)
    todo: list[Source] = []
    for spk in select_speakers(by_spk, speakers, seed, keep=keep):
        files = by_spk[spk]
        if max_utterances and len(files) > max_utterances:
            files = random.Random(f"cap:{seed}:{spk}").sample(files, max_utterances)
        todo += sorted(files, key=lambda s: s.id)
    return todo


def _decode_all(todo: list[Source], out: Path, jobs: int, progress: bool, index: dict[str, dict]) -> list[dict]:
    """Decode/validate every file (threads; cached in audio_index.json); one entry per file."""
    index_path = out / "audio_index.json"
    workers = jobs or min(4, os.cpu_count() or 1)
    # Threads, not processes: FFmpeg, libsndfile and scipy drop the GIL for much of the work,
    # and no worker has to re-import torch.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        work = pool.map(lambda s: _convert_one(s, out / "wav", index.get(s.path)), todo)
        entries = list(tqdm(work, total=len(todo), unit="file", desc="decoding audio",
                            disable=not progress))
    index.update({src.path: entry for src, entry in zip(todo, entries)})
    _write_json(index_path, index)
    return entries


def _utterances(todo: list[Source], entries: list[dict], min_frames: int,
                meta: dict[str, dict[str, str]], text: dict[str, str]):
    """Good files as Utterances (with gender/text extras), plus the failed and too-short ones."""
    utts, failed, too_short = [], [], []
    for src, entry in zip(todo, entries):
        if "error" in entry:
            failed.append({"path": src.path, "reason": entry["error"]})
        elif entry["frames"] < min_frames:
            too_short.append({"path": src.path, "seconds": entry["frames"] / SR})
        else:
            extra = {}
            if meta:
                extra["gender"] = meta.get(src.spk_id, {}).get("gender", "")
            if text:
                extra["text"] = text.get(src.id, "")
            utts.append(Utterance(src.spk_id, src.video, src.utt, entry["wav"], entry["frames"],
                                  extra))
    return utts, failed, too_short


def _columns(utts: list[Utterance]) -> list[str]:
    extra = list(utts[0].extra) if utts else []
    return ["ID", "duration", "wav", "start", "stop", "spk_id", *extra]


app = typer.Typer(add_completion=False, help="VoxCeleb2 forget/retain manifests.")


@app.callback()
def _root() -> None:
    """VoxCeleb2 data preparation."""


_Opt = typer.Option


@app.command("prepare")
def prepare_command(
    root: Annotated[Path, _Opt("--root", help="VoxCeleb2 tree: dev/aac/idNNNNN/<video>/NNNNN.m4a "
                               "(and/or test/aac/...; .wav/.flac work too).")],
    out: Annotated[Path, _Opt("--out", help="Output folder: manifests, converted wavs, report.")],
    meta: Annotated[Path | None, _Opt(help="vox2_meta.csv (adds a gender column); default "
                                      "<root>/vox2_meta.csv when present.")] = None,
    transcripts: Annotated[Path | None, _Opt(help="CSV with ID,text (adds a text column unless "
                                             "segmenting); default <root>/transcripts.csv")] = None,
    sets: Annotated[str, _Opt(help="Comma list of subsets to read: dev, test.")] = "dev,test",
    speakers: Annotated[int, _Opt(min=0, help="Keep this many speakers, by --seed (0: all).")] = 0,
    forget_speakers: Annotated[str, _Opt(help="Number of forget speakers drawn by --seed, or a "
                                         "comma list of IDs (id00012,id00015).")] = "2",
    forget_fraction: Annotated[float, _Opt(min=0.0, max=0.5, help="Sample level: fraction of each "
                                           "retained speaker's training utterances to forget; as "
                                           "many more become the never-trained holdout.")] = 0.1,
    test_video_fraction: Annotated[float, _Opt(min=0.0, max=1.0, help="Per speaker, fraction of "
                                               "videos held out for the *_test splits (at least "
                                               "one, at most all but one).")] = 0.2,
    max_utterances: Annotated[int, _Opt(min=0, help="Per speaker, at most this many files, drawn "
                                        "by --seed before decoding (0: all).")] = 0,
    segment_seconds: Annotated[float, _Opt(min=0.0, help="Cut files into fixed segments of this "
                                           "many seconds with start/stop (0: whole files).")] = 0.0,
    min_duration: Annotated[float, _Opt(min=0.0, help="Leave out files shorter than this (seconds; VoxCeleb2 "
                                        "clips are >= 4 s, so 1.0 drops only damaged ones).")] = MIN_DURATION,
    seed: Annotated[int, _Opt(help="Seed of every random choice (speakers, splits, caps).")] = 0,
    jobs: Annotated[int, _Opt(min=0, help="Decoding threads (0: up to 4).")] = 0,
    force: Annotated[bool, _Opt(help="Rebuild even when the stamp says up to date; discard a corrupt "
                                "audio_index.json (decode cache).")] = False,
    allow_no_gender: Annotated[bool, _Opt("--allow-no-gender", help="Accept a meta file without a Gender "
                                          "column (no gender column in the manifests).")] = False,
    allow_fewer: Annotated[bool, _Opt("--allow-fewer", help="Write the manifests even when fewer speakers or "
                                      "utterances than asked survive (listed in prepare_report.json).")] = False,
) -> None:
    """Decode audio to 16 kHz wav and write speaker- and sample-level forget/retain manifests."""
    forget = parse_forget_speakers(forget_speakers)
    res = prepare(root, out, meta=meta, transcripts=transcripts, speakers=speakers,
                  sets=[s.strip() for s in sets.split(",") if s.strip()], forget_speakers=forget,
                  forget_fraction=forget_fraction, test_video_fraction=test_video_fraction,
                  max_utterances=max_utterances, segment_seconds=segment_seconds,
                  min_duration=min_duration, seed=seed, jobs=jobs, force=force,
                  allow_no_gender=allow_no_gender, allow_fewer=allow_fewer)
    echo_report(res)


def parse_forget_speakers(text: str) -> int | list[str]:
    """``--forget-speakers``: a count or a comma list of speaker IDs."""
    return int(text) if text.strip().isdigit() else [s.strip() for s in text.split(",") if s.strip()]


#: Per-speaker columns of the printed summary: (header, key in the report's ``per_speaker``).
_SPEAKER_COLUMNS = (("files", "files"), ("short", "too_short"), ("bad", "failed"), ("fgt-tr", "spk_forget_train"),
                    ("fgt-te", "spk_forget_test"), ("ret-tr", "spk_retain_train"), ("ret-te", "spk_retain_test"),
                    ("s-fgt", "sample_forget"), ("s-hold", "sample_holdout"))


def echo_report(res: PrepareResult) -> None:
    """Print what ``prepare`` wrote: split sizes, per-speaker counts, what was left out and why."""
    rep = res.report
    min_duration = rep["options"]["min_duration"]
    typer.echo(f"{res.out}: {'up to date (skipped)' if res.skipped else 'written'}; "
               f"forget speakers {rep['forget_speakers']}")
    for name, c in rep["counts"].items():
        typer.echo(f"  {name + '.csv':22s} {c['utterances']:7d} utts {c['rows']:7d} rows "
                   f"{c['speakers']:5d} spk {c['hours']:8.3f} h")
    per_speaker = rep.get("per_speaker", {})
    if per_speaker:
        typer.echo("  per speaker: " + " ".join(f"{h:>7s}" for h, _ in _SPEAKER_COLUMNS))
        for spk, c in per_speaker.items():
            typer.echo(f"  {spk[:12]:>12s}: " + " ".join(f"{c.get(k, 0):7d}" for _, k in _SPEAKER_COLUMNS))
    for item in rep["failed"]:
        typer.echo(f"  left out (unreadable/silent): {item['path']}: {item['reason']}", err=True)
    if rep.get("speakers_without_gender"):
        typer.echo(f"  no gender in the meta file for {len(rep['speakers_without_gender'])} speaker(s): "
                   f"{rep['speakers_without_gender'][:10]}", err=True)
    typer.echo(f"  duration filter (--min-duration {min_duration} s): left out {len(rep['too_short'])} of "
               f"{rep['files_selected']} files", err=bool(rep["too_short"]))
    for item in rep.get("shortfalls", []):
        typer.echo(f"  allowed shortfall (--allow-fewer): {item}", err=True)
    seg = rep.get("segments") or {}
    if seg.get("segment_seconds"):
        typer.echo(f"  segments of {seg['segment_seconds']:g} s: {seg['dropped_seconds']:.1f} s of audio dropped after "
                   f"the last full segment of each file ({100 * seg['dropped_fraction']:.1f} %)")
    for item in rep.get("warnings", []):
        typer.echo(f"  warning: {item}", err=True)


def main(argv: list[str] | None = None) -> None:
    """The command line: errors a user caused print as one ``error:`` line and exit 2 (as ``mmunlearn`` does)."""
    run_app(app, argv, "data_prep.voxceleb2")


if __name__ == "__main__":
    main()
