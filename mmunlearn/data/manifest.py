"""Speech manifests (SpeechBrain CSV ``ID,duration,wav,start,stop,spk_id``) and forget/retain splits.

``duration`` is in seconds, ``start``/``stop`` are sample indices at 16 kHz into ``wav`` (an
absolute path), so SpeechBrain's ``DynamicItemDataset.from_csv`` and :func:`read_manifest` read
the same files. Extra columns (``gender``, ``text``, ...) pass through as strings.

Rows are checked before anything trains on them (:func:`check_rows`, ``read_manifest(...,
check_files=True)``): a bad manifest fails at once with one error naming the file and listing the
bad rows, instead of mid-run when the loader first opens ``../../etc/passwd`` as audio.

Splits (:func:`make_splits`) work on :class:`Utterance` records of any corpus with speakers and
recording sessions ("videos"); they are made per utterance, so all segments of one recording
always land in the same split.
"""

from __future__ import annotations

import csv
import math
import operator
import os
import random
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf

from mmunlearn.files.atomic import atomic_path
from mmunlearn.progress import StageBar

#: Columns every manifest carries, in this order.
MANIFEST_COLUMNS: tuple[str, ...] = ("ID", "duration", "wav", "start", "stop", "spk_id")
_TYPES = {"duration": float, "start": int, "stop": int}


class ManifestError(ValueError):
    """A manifest file is missing, malformed or inconsistent. The message names the file."""


#: File name endings of the audio :func:`check_rows` accepts (what :mod:`mmunlearn.data.audio` decodes).
AUDIO_SUFFIXES: frozenset[str] = frozenset(
    {".wav", ".flac", ".ogg", ".oga", ".opus", ".aiff", ".aif", ".m4a", ".aac", ".mp4", ".mp3", ".webm"}
)
#: How many bad rows one error lists (the rest are counted).
MAX_LISTED = 10
#: Sample rates a manifest's audio may have: 8 kHz telephone speech and up; 1 Hz "audio" would crash the
#: feature extractors long after the checks.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 192_000
#: From this many rows on, the file checks show a progress bar (VoxCeleb2's dev set has ~1.1 million).
PROGRESS_ROWS = 50_000
PROGRESS_BYTES = 5_000_000  # a manifest file this big (~100,000 rows) shows its rows being read


def _problems_message(source: str, problems: list[str], bad_rows: int, total_rows: int) -> str:
    listed = "\n  ".join(problems[:MAX_LISTED])
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"{source}: {bad_rows} bad row(s) of {total_rows}; nothing was run:\n  {listed}{more}"


def _wav_problem(wav: Any, root: Path | None) -> str | None:
    """Why the audio file ``wav`` (opened as given: a relative path from the working directory, as the
    audio loader does) cannot be used, or None."""
    path = Path(os.fsdecode(wav)) if isinstance(wav, (str, bytes, os.PathLike)) else None
    if path is None:
        return None  # a decoded waveform: nothing to open
    if not str(path).strip():
        return "empty 'wav' path"
    if path.suffix.lower() not in AUDIO_SUFFIXES:
        return (
            f"'wav' {str(path)!r} is not an audio file name (.wav, .flac, .m4a, ...; "
            "mmunlearn.data.manifest.AUDIO_SUFFIXES)"
        )
    try:
        real = path.resolve(strict=True)  # follows symlinks: what would really be opened
        st = real.stat()
    except (OSError, RuntimeError):  # missing, dangling link, loop, permission on a parent
        return f"'wav' {str(path)!r} does not exist"
    if not stat.S_ISREG(st.st_mode):
        return f"'wav' {str(path)!r} is not a regular file"
    if not os.access(real, os.R_OK):
        return f"'wav' {str(path)!r} is not readable"
    if root is not None and not real.is_relative_to(root):
        return f"'wav' {str(path)!r} resolves to {real}, outside the data folder {root}"
    if path.suffix.lower() in (".wav", ".flac"):  # the header is cheap to read; other formats are decoded later
        try:
            rate = sf.info(str(real)).samplerate
        except (RuntimeError, sf.LibsndfileError, OSError):
            return None  # unreadable audio is reported, naming the file, when it is decoded
        if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            return (
                f"'wav' {str(path)!r} has a sample rate of {rate} Hz, outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} "
                "Hz (not speech audio)"
            )
    return None


def _empty(value: Any) -> bool:
    return value is None or isinstance(value, str) and not value.strip()


def _parse_row(row: dict[str, Any]) -> list[str]:
    """Convert ``duration``/``start``/``stop`` in place; the problems found."""
    problems = []
    for col, typ in _TYPES.items():
        value = row.get(col)
        if col not in row or isinstance(value, typ) and not isinstance(value, bool):
            continue
        try:
            if typ is float:
                row[col] = float(value)
            elif isinstance(value, str):
                row[col] = int(value)
            else:  # numbers given in memory: integral floats and numpy integers are fine
                row[col] = int(value) if isinstance(value, float) and value.is_integer() else operator.index(value)
        except (TypeError, ValueError):
            problems.append(f"column {col!r} value {value!r} is not {typ.__name__}")
    dur = row.get("duration")
    if isinstance(dur, float) and not (math.isfinite(dur) and dur >= 0):
        problems.append(f"duration {dur!r} is not a finite number >= 0")
    start, stop = row.get("start"), row.get("stop")
    if isinstance(start, int) and start < 0:
        problems.append(f"start {start} < 0")
    if isinstance(start, int) and isinstance(stop, int) and stop <= start:
        problems.append(f"stop {stop} <= start {start}")
    return problems


def check_rows(
    rows: Sequence[Mapping[str, Any]],
    source: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    required: Sequence[str] = (),
) -> None:
    """Check rows before any training reads them; one :class:`ManifestError` lists every bad row.

    Per row: the ``required`` columns are present and non-empty; ``duration``/``start``/``stop`` parse
    (``duration`` finite >= 0, ``0 <= start < stop``); a ``wav`` given as a path names an existing,
    regular, readable file with an audio suffix (:data:`AUDIO_SUFFIXES`), after following symlinks,
    and, with ``root``, inside ``root``. A relative ``wav`` is checked as the audio loader opens it,
    from the working directory. ``wav`` values that are waveforms (arrays, tensors) are not files and
    pass. ``source`` names the rows in the message (a manifest path, or e.g. ``"forget items"``); the
    first :data:`MAX_LISTED` bad rows are listed and the rest counted. The rows are not modified.
    """
    base = Path(root).resolve() if root is not None else None
    problems, bad_rows = [], 0
    shown = StageBar(
        rows,
        desc=f"checking {len(rows)} rows of {source}",
        unit="row",
        leave=False,
        disable=len(rows) < PROGRESS_ROWS,
        dynamic_ncols=True,
    )
    for i, raw in enumerate(shown):
        where = f"row {i}"
        if not isinstance(raw, Mapping):
            problems.append(f"{where}: expected a mapping, got {type(raw).__name__}")
            bad_rows += 1
            continue
        row = dict(raw)
        if not _empty(row.get("ID")):
            where += f" (ID {row['ID']!r})"
        found = [f"missing {c!r}" for c in required if _empty(row.get(c))]
        found += _parse_row(row)
        wav_problem = None if _empty(row.get("wav")) else _wav_problem(row["wav"], base)
        found += [wav_problem] if wav_problem else []
        problems += [f"{where}: {p}" for p in found]
        bad_rows += bool(found)
    if problems:
        raise ManifestError(_problems_message(str(source), problems, bad_rows, len(rows)))


def read_manifest(
    path: str | os.PathLike,
    required: Sequence[str] = MANIFEST_COLUMNS,
    *,
    check_files: bool = False,
    root: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """Read a manifest CSV into a list of dicts (``duration`` float, ``start``/``stop`` int).

    Raises one :class:`ManifestError` naming the file when it is missing, not UTF-8 CSV, or lacks a
    ``required`` column, or listing every bad row (first :data:`MAX_LISTED`, then a count): an empty
    or duplicate ``ID``, a wrong number of fields, a value that does not parse, ``stop <= start``.
    ``check_files`` also checks every ``wav`` file as :func:`check_rows` does (exists, regular,
    readable, audio suffix; inside ``root`` when given), which every reader that trains or unlearns
    from the rows should ask for (:func:`mmunlearn.data.utterances.split_rows` does).
    """
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: manifest not found")
    base = Path(root).resolve() if root is not None else None
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    bad_rows = 0
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in required if c not in header]
            if missing:
                raise ManifestError(f"{path}: missing column(s) {missing}; header has {header or 'nothing'}")
            reader.fieldnames = header
            seen: set[str] = set()
            line = 1
            big = path.stat().st_size >= PROGRESS_BYTES  # ~100,000 rows and more: show the rows read
            for line, raw in enumerate(
                StageBar(reader, desc=f"reading {path}", unit="row", leave=False, disable=not big, dynamic_ncols=True),
                start=2,
            ):
                row: dict[str, Any] = {k: (v.strip() if isinstance(v, str) else v) for k, v in raw.items()}
                found = _row_problems(row, seen, check_files, base)  # a bad row is never returned: it raises below
                problems += [f"{path}:{line}: {p}" for p in found]
                bad_rows += bool(found)
                rows.append(row)
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text ({exc})") from None
    except csv.Error as exc:
        raise ManifestError(f"{path}: not a readable CSV file ({exc})") from None
    if problems:
        raise ManifestError(_problems_message(str(path), problems, bad_rows, line - 1))
    return rows


def _row_problems(row: dict[str, Any], seen: set[str], check_files: bool, base: Path | None) -> list[str]:
    """What is wrong with one read row: its field count, its values (parsed in place), its ID, its wav file."""
    if None in row or any(v is None for v in row.values()):
        return ["wrong number of fields"]
    found = _parse_row(row)
    if "ID" in row:
        if not row["ID"]:
            found.append("empty ID")
        elif row["ID"] in seen:
            found.append(f"duplicate ID {row['ID']!r}")
        seen.add(row["ID"])
    if check_files:
        wav_problem = _wav_problem(row.get("wav"), base) if row.get("wav") else "empty 'wav' path"
        found += [wav_problem] if wav_problem else []
    return found


def write_manifest(
    path: str | os.PathLike,
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
) -> Path:
    """Write ``rows`` as a manifest CSV atomically (temp file in the same folder + rename).

    ``columns`` defaults to :data:`MANIFEST_COLUMNS` followed by any extra keys of the first row
    (in its order). Every row must hold every column; floats are written with 4 decimals.
    """
    path = Path(path)
    rows = list(rows)
    if columns is None:
        extra = [k for k in (rows[0] if rows else {}) if k not in MANIFEST_COLUMNS]
        columns = [*MANIFEST_COLUMNS, *extra]
    missing_base = [c for c in MANIFEST_COLUMNS if c not in columns]
    if missing_base:
        raise ManifestError(f"{path}: columns {list(columns)} lack required {missing_base}")
    for i, row in enumerate(rows):
        lacking = [c for c in columns if c not in row]
        if lacking:
            raise ManifestError(f"{path}: row {i} (ID={row.get('ID')!r}) lacks {lacking}")
    with atomic_path(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([f"{row[c]:.4f}" if isinstance(row[c], float) else row[c] for c in columns])
    return path


#: Split names, in the order they are written. The first five partition the kept utterances;
#: ``sample_forget`` is a subset of ``spk_retain_train``; ``train`` = both ``*_train`` splits and
#: ``sample_retain`` = ``train`` minus ``sample_forget``.
SPLIT_NAMES: tuple[str, ...] = (
    "spk_forget_train",
    "spk_forget_test",
    "spk_retain_train",
    "spk_retain_test",
    "sample_holdout",
    "sample_forget",
    "sample_retain",
    "train",
)


@dataclass(frozen=True)
class Utterance:
    """One recording: speaker, video (session), utterance name, audio file, length in samples."""

    spk_id: str
    video: str
    utt: str
    wav: str
    frames: int
    extra: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def id(self) -> str:
        return f"{self.spk_id}--{self.video}--{self.utt}"


def select_speakers(speakers: Iterable[str], n: int, seed: int, keep: Iterable[str] = ()) -> list[str]:
    """``n`` speakers (all when ``n <= 0``) drawn by ``seed``, always including ``keep``; sorted."""
    pool, keep = sorted(set(speakers)), sorted(set(keep))
    unknown = [s for s in keep if s not in pool]
    if unknown:
        raise ValueError(f"speaker(s) {unknown} not found among {len(pool)} speakers")
    if n <= 0 or n >= len(pool):
        return pool
    if n < len(keep):
        raise ValueError(f"--speakers {n} is fewer than the {len(keep)} explicit forget speakers")
    rest = [s for s in pool if s not in keep]
    return sorted(keep + random.Random(f"speakers:{seed}").sample(rest, n - len(keep)))


def choose_forget_speakers(speakers: Sequence[str], forget: int | Sequence[str], seed: int) -> list[str]:
    """``forget`` speakers drawn by ``seed`` (an int) or the given IDs; leaves >= 1 retained."""
    pool = sorted(set(speakers))
    if isinstance(forget, int):
        if not 0 < forget < len(pool):
            raise ValueError(f"forget speakers must be in [1, {len(pool) - 1}] for {len(pool)} speakers, got {forget}")
        return sorted(random.Random(f"forget:{seed}").sample(pool, forget))
    chosen = sorted(set(forget))
    unknown = [s for s in chosen if s not in pool]
    if unknown or not chosen or len(chosen) >= len(pool):
        raise ValueError(
            f"forget speakers {chosen} must be known ({unknown} are not) and leave one of {len(pool)} retained"
        )
    return chosen


def make_splits(
    utts: Sequence[Utterance],
    forget_speakers: Sequence[str],
    forget_fraction: float = 0.1,
    test_video_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[dict[str, list[Utterance]], dict[str, Any]]:
    """Speaker-level and sample-level forget/retain splits (see :data:`SPLIT_NAMES`).

    Per speaker, ``round(test_video_fraction * n_videos)`` videos (at least 1, at most all but 1)
    are test videos: their utterances form the ``*_test`` splits and never enter training. A
    speaker with one video has no test part. For each retained speaker, ``k = round(forget_fraction
    * n_train)`` (at least 1 when the fraction is > 0, at most half) of its training utterances form
    ``sample_forget`` and another ``k`` of them ``sample_holdout``, which leaves training. Returns
    the splits (each sorted by ID) and info (test videos per speaker, speakers without one).
    """
    if not 0.0 <= forget_fraction <= 0.5:
        raise ValueError(f"forget_fraction must be in [0, 0.5] (an equal holdout is drawn), got {forget_fraction}")
    if not 0.0 < test_video_fraction < 1.0:
        raise ValueError(f"test_video_fraction must be in (0, 1), got {test_video_fraction}")
    ids = [u.id for u in utts]
    if len(set(ids)) != len(ids):
        raise ValueError("utterance IDs are not unique")
    by_spk: dict[str, list[Utterance]] = {}
    for u in sorted(utts, key=lambda u: u.id):
        by_spk.setdefault(u.spk_id, []).append(u)
    unknown = sorted(set(forget_speakers) - set(by_spk))
    if unknown:
        raise ValueError(f"forget speakers {unknown} have no utterances")
    splits: dict[str, list[Utterance]] = {name: [] for name in SPLIT_NAMES}
    info: dict[str, Any] = {"test_videos": {}, "speakers_without_test_video": []}
    for spk, items in by_spk.items():
        rng = random.Random(f"split:{seed}:{spk}")
        videos = sorted({u.video for u in items})
        n_test = min(max(1, round(test_video_fraction * len(videos))), len(videos) - 1)
        test_videos = set(rng.sample(videos, n_test))
        info["test_videos"][spk] = sorted(test_videos)
        if not test_videos:
            info["speakers_without_test_video"].append(spk)
        train = [u for u in items if u.video not in test_videos]
        test = [u for u in items if u.video in test_videos]
        if spk in forget_speakers:
            splits["spk_forget_train"] += train
            splits["spk_forget_test"] += test
            continue
        splits["spk_retain_test"] += test
        k = min(len(train) // 2, max(1, round(forget_fraction * len(train))))
        k = k if forget_fraction > 0 else 0
        rng.shuffle(train)
        splits["sample_forget"] += train[:k]
        splits["sample_holdout"] += train[k : 2 * k]
        splits["spk_retain_train"] += train[:k] + train[2 * k :]
    held = {u.id for u in splits["sample_forget"]}
    splits["train"] = splits["spk_forget_train"] + splits["spk_retain_train"]
    splits["sample_retain"] = [u for u in splits["train"] if u.id not in held]
    return {k: sorted(v, key=lambda u: u.id) for k, v in splits.items()}, info


def segment_rows(utt: Utterance, sr: int = 16000, segment_seconds: float = 0.0) -> list[dict[str, Any]]:
    """Manifest rows for one utterance: the whole file, or ``floor(len / seg)`` fixed segments.

    With ``segment_seconds > 0`` a file shorter than one segment gives one row for the whole file;
    the remainder after the last full segment is dropped. IDs get a ``_start_stop`` suffix.
    """
    seg = int(round(segment_seconds * sr))
    if seg <= 0 or utt.frames <= seg:
        bounds = [(0, utt.frames)]
    else:
        bounds = [(i * seg, (i + 1) * seg) for i in range(utt.frames // seg)]
    rows = []
    for start, stop in bounds:
        rid = utt.id if seg <= 0 else f"{utt.id}_{start}_{stop}"
        rows.append(
            {
                "ID": rid,
                "duration": (stop - start) / sr,
                "wav": utt.wav,
                "start": start,
                "stop": stop,
                "spk_id": utt.spk_id,
                **dict(utt.extra),
            }
        )
    return rows
