"""Writing the forget/retain manifests and the report from any corpus's audio files (:func:`prepare_sources`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_prep.voxceleb2_checks import ShortfallError, _per_speaker, _split_shortfalls, speaker_warnings
from data_prep.voxceleb2_decode import SR, _decode_all, _write_json, read_audio_index
from data_prep.voxceleb2_inputs import Source
from mmunlearn.data.manifest import (
    SPLIT_NAMES,
    Utterance,
    choose_forget_speakers,
    make_splits,
    segment_rows,
    select_speakers,
    write_manifest,
)

log = logging.getLogger(__name__)


@dataclass
class PrepareResult:
    """What :func:`data_prep.voxceleb2.prepare` produced: the manifest paths, the report, and whether it was skipped."""

    out: Path
    manifests: dict[str, Path]
    report: dict[str, Any]
    skipped: bool = False


def _options_digest(options: dict, sources: list[Source], side_files: Sequence[Path | None]) -> str:
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for path in side_files:  # meta / transcripts: their content matters too
        if path is not None:
            h.update(hashlib.sha256(path.read_bytes()).digest())
    for s in sources:
        h.update(f"{s.path}\0{s.size}\0{s.mtime_ns}\n".encode())
    return h.hexdigest()


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
    and ``allow_fewer`` (see :func:`data_prep.voxceleb2.prepare`); all of it, with the sources and the ``side_files``'
    content, makes the stamp: the same again skips the run. ``genders``: speaker -> gender (adds a
    gender column); ``text``: utterance ID -> transcript (adds a text column).
    """
    out = Path(out).resolve()
    genders, text = genders or {}, text or {}
    forget_speakers, seed = options["forget_speakers"], options["seed"]
    explicit = None if isinstance(forget_speakers, int) else sorted(forget_speakers)
    digest = _options_digest(options, list(sources), side_files)
    stamp_path, report_path = out / "prepare_stamp.json", out / "prepare_report.json"
    manifests = {name: out / f"{name}.csv" for name in SPLIT_NAMES}
    if not force and (earlier := _earlier_report(stamp_path, report_path, manifests, digest)) is not None:
        return PrepareResult(out, manifests, earlier, skipped=True)

    todo, utts, failed, too_short = _decode_selected(
        list(sources), out, options, explicit, genders, text, force=force, jobs=jobs, progress=progress
    )
    selected, kept = sorted({s.spk_id for s in todo}), sorted({u.spk_id for u in utts})
    shortfalls = _decoding_shortfalls(options, sources, selected, kept, len(too_short), len(failed))
    forget = choose_forget_speakers(kept, explicit or forget_speakers, seed)
    splits, info = make_splits(utts, forget, options["forget_fraction"], options["test_video_fraction"], seed)
    per_speaker = _per_speaker(splits, todo, too_short, failed)
    shortfalls += _split_shortfalls(splits, per_speaker, options)
    _settle_shortfalls(shortfalls, len(too_short), options)
    no_gender = _speakers_without_gender(kept, genders, genders_from)

    # Written beside the final files, then moved into place; the old stamp goes first, the new one last.
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".prepare-tmp-"))
    try:
        counts = _write_split_manifests(staging, splits, manifests, utts, options["segment_seconds"])
        segments, original = _segments(counts, utts, options["segment_seconds"]), _original_training(splits)
        for item in speaker_warnings(kept):
            log.warning("%s", item)
        report = {
            "options": options,
            "files_found": len(sources),
            "duplicates": duplicates,
            "files_selected": len(todo),
            "failed": failed,
            "too_short": too_short,
            "forget_speakers": forget,
            "retain_speakers": [s for s in kept if s not in forget],
            "speakers_without_gender": no_gender,
            "counts": counts,
            "per_speaker": per_speaker,
            "shortfalls": shortfalls,
            "warnings": speaker_warnings(kept),
            "segments": segments,
            "original_training": original,
            **info,
        }
        _publish(staging, manifests, report_path, report, stamp_path, {"digest": digest, "options": options})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PrepareResult(out, manifests, report)


def _decode_selected(
    sources: list[Source],
    out: Path,
    options: dict[str, Any],
    explicit: list[str] | None,
    genders: dict[str, str],
    text: dict[str, str],
    *,
    force: bool,
    jobs: int,
    progress: bool,
) -> tuple[list[Source], list[Utterance], list[dict], list[dict]]:
    """Pick the files, decode them into ``out``; return them with the good, failed and too-short utterances."""
    seed = options["seed"]
    todo = _select_files(
        sources, options["speakers"], explicit or [], options["max_utterances"], seed
    )  # unknown IDs fail here
    choose_forget_speakers(
        sorted({s.spk_id for s in todo}), explicit or options["forget_speakers"], seed
    )  # count fits?
    index = read_audio_index(out / "audio_index.json", force=force)
    out.mkdir(parents=True, exist_ok=True)
    entries = _decode_all(todo, out, jobs, progress, index)
    utts, failed, too_short = _utterances(
        todo, entries, int(round(options["min_duration"] * SR)), {k: {"gender": g} for k, g in genders.items()}, text
    )
    return todo, utts, failed, too_short


def _speakers_without_gender(kept: list[str], genders: dict[str, str], genders_from: Path | None) -> list[str]:
    """The kept speakers the gender list leaves out (logged); empty when no gender list was given."""
    no_gender = sorted(s for s in kept if not genders.get(s)) if genders else []
    if no_gender:
        log.warning("%s gives no gender for %d kept speaker(s): %s", genders_from, len(no_gender), no_gender[:10])
    return no_gender


def _publish(
    staging: Path,
    manifests: dict[str, Path],
    report_path: Path,
    report: dict[str, Any],
    stamp_path: Path,
    stamp: dict[str, Any],
) -> None:
    """Move the staged manifests and report into place, the old stamp removed first and the new one written last."""
    _write_json(staging / report_path.name, report)
    stamp_path.unlink(missing_ok=True)  # an interrupted move must not look finished
    for path in [*manifests.values(), report_path]:
        os.replace(staging / path.name, path)
    _write_json(stamp_path, stamp)


def _earlier_report(
    stamp_path: Path, report_path: Path, manifests: dict[str, Path], digest: str
) -> dict[str, Any] | None:
    """The finished earlier run's report when its stamp carries ``digest``; None when the run must be (re)built."""
    if not all(p.is_file() for p in [stamp_path, report_path, *manifests.values()]):
        return None
    try:
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # a damaged stamp or report: rebuild
    if isinstance(stamp, dict) and isinstance(report, dict) and stamp.get("digest") == digest:
        return report
    return None


def _decoding_shortfalls(
    options: dict[str, Any],
    sources: Sequence[Source],
    selected: list[str],
    kept: list[str],
    n_too_short: int,
    n_failed: int,
) -> list[str]:
    """What decoding and the duration filter left short of the ask; raises when too few speakers remain."""
    found = len({s.spk_id for s in sources})
    speakers, forget_speakers, min_duration = options["speakers"], options["forget_speakers"], options["min_duration"]
    wanted = min(speakers, found) if speakers > 0 else found
    shortfalls = [f"{speakers} speakers asked for, {found} found"] if speakers > found else []
    lost = [s for s in selected if s not in kept]
    if lost or len(kept) < wanted:
        shortfalls.append(
            f"{len(kept)} of {wanted} speakers left after decoding and the duration filter "
            f"(every file of {lost[:10]} was unreadable or shorter than {min_duration} s)"
        )
    if len(kept) < 2 or (isinstance(forget_speakers, int) and forget_speakers >= len(kept)):
        raise ShortfallError(
            f"{len(kept)} speaker(s) left after decoding and the duration filter "
            f"({n_too_short} file(s) shorter than {min_duration} s, {n_failed} unreadable): "
            f"too few to forget {forget_speakers} and keep one; lower --min-duration"
        )
    return shortfalls


def _settle_shortfalls(shortfalls: list[str], n_too_short: int, options: dict[str, Any]) -> None:
    """Raise :class:`ShortfallError` over ``shortfalls`` unless ``allow_fewer``; then log each as allowed."""
    if not shortfalls:
        return
    min_duration = options["min_duration"]
    hint = f"; {n_too_short} file(s) were shorter than --min-duration {min_duration} s" if n_too_short else ""
    if not options.get("allow_fewer"):
        raise ShortfallError(
            "cannot prepare what was asked: "
            + "; ".join(shortfalls)
            + hint
            + ". Pass --allow-fewer (allow_fewer=True) to write the manifests anyway"
        )
    for item in shortfalls:
        log.warning("allowed shortfall: %s", item)


def _write_split_manifests(
    staging: Path,
    splits: dict[str, list[Utterance]],
    manifests: dict[str, Path],
    utts: list[Utterance],
    segment_seconds: float,
) -> dict[str, dict[str, Any]]:
    """Write each split's segmented manifest into ``staging``; return its counts by split name."""
    counts = {}
    for name, items in splits.items():
        rows = [r for u in items for r in segment_rows(u, SR, segment_seconds)]
        write_manifest(staging / manifests[name].name, rows, columns=_columns(utts))
        kept_seconds = sum(r["duration"] for r in rows)
        counts[name] = {
            "utterances": len(items),
            "rows": len(rows),
            "speakers": len({u.spk_id for u in items}),
            "hours": round(kept_seconds / 3600, 4),
            "dropped_seconds": round(sum(u.frames for u in items) / SR - kept_seconds, 3),
        }
    return counts


def _segments(counts: dict[str, dict[str, Any]], utts: list[Utterance], segment_seconds: float) -> dict[str, Any]:
    """The report's segments entry: how much audio segmenting dropped."""
    audio_seconds = sum(u.frames for u in utts) / SR
    dropped = counts["train"]["dropped_seconds"] + sum(
        counts[n]["dropped_seconds"] for n in ("spk_forget_test", "spk_retain_test", "sample_holdout")
    )
    return {
        "segment_seconds": segment_seconds,
        "dropped_seconds": round(dropped, 3),
        "dropped_fraction": round(dropped / audio_seconds, 4) if audio_seconds else 0.0,
    }


def _original_training(splits: dict[str, list[Utterance]]) -> dict[str, Any]:
    """The report's original_training entry: what the original model trains on."""
    holdout_out = len(splits.get("sample_holdout", []))
    return {
        "utterances": len(splits["train"]),
        "depends_on_forget_speakers": holdout_out > 0,
        "note": "train = the forget speakers' training utterances + the retained speakers' minus "
        f"their sample-level holdout ({holdout_out} utterances), which is drawn from retained "
        "speakers only: another --forget-speakers gives the original model another training "
        "set (all of a speaker's training utterances when it is forgotten, all but its "
        "holdout when it is kept)",
    }


def _select_files(
    sources: list[Source], speakers: int, keep: list[str], max_utterances: int, seed: int
) -> list[Source]:
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


def _utterances(
    todo: list[Source], entries: list[dict], min_frames: int, meta: dict[str, dict[str, str]], text: dict[str, str]
):
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
            utts.append(Utterance(src.spk_id, src.video, src.utt, entry["wav"], entry["frames"], extra))
    return utts, failed, too_short


def _columns(utts: list[Utterance]) -> list[str]:
    extra = list(utts[0].extra) if utts else []
    return ["ID", "duration", "wav", "start", "stop", "spk_id", *extra]
