"""Speech forget/retain sets in the formats users have, read into manifest rows (``ID``, ``wav``, ``spk_id``, ...).

Sources: a SpeechBrain manifest CSV (:func:`~mmunlearn.data.manifest.read_manifest`), a CSV/TSV, JSON or JSONL file
with an audio and a label column, a list of (path, label) pairs or of dicts, a Hugging Face ``datasets.Dataset``
with an ``Audio`` column (audio held as bytes or arrays is written to ``audio_dir`` as 16-bit WAV files) and a
label column (a ``ClassLabel`` gives its names). Relative audio paths resolve against the folder of the file that
names them (in-memory sets: the working directory at the call), so the rows hold absolute paths; every row is
checked by :func:`~mmunlearn.data.manifest.check_rows` (audio files exist, are regular, readable audio) before
the rows are returned.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from mmunlearn.data.audio import check_duration, save_wav
from mmunlearn.data.manifest import MANIFEST_COLUMNS, check_rows, read_manifest
from mmunlearn.data.user.files import DataFormatError, dataset_module, fields_found, fields_named, short, source_items

#: Field names (case-insensitive) read as the audio file and the speaker label of a speech row.
AUDIO_FIELDS: tuple[str, ...] = ("wav", "audio", "path", "file")
LABEL_FIELDS: tuple[str, ...] = ("spk_id", "speaker", "speaker_id", "label")
ID_FIELDS: tuple[str, ...] = ("id",)


def _one_field(row: Mapping[str, Any], names: tuple[str, ...], what: str, where: str) -> str:
    found = fields_named(row, names)
    if len(found) != 1:
        problem = f"ambiguous {what} fields {', '.join(map(repr, found))}" if found else f"no {what} field"
        raise DataFormatError(
            f"{where}: {problem} (fields found: {fields_found(row)}); expected exactly one of {'|'.join(names)}"
        )
    return found[0]


def _label(value: Any, where: str) -> str:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    if not isinstance(value, str):
        raise DataFormatError(
            f"{where}: the speaker label is not text or an integer (got {type(value).__name__} {short(value)})"
        )
    return value.strip()


def _path(value: str | os.PathLike, base: Path | None, where: str = "") -> str:
    """An absolute path: a relative one joined to ``base`` (the folder of the file naming it), else the cwd."""
    text = os.fspath(value)
    if "\0" in text:
        raise DataFormatError(f"{where}: the audio path holds a NUL byte ({short(text)})")
    if not text.strip():
        return ""  # check_rows reports the empty path, naming the row
    path = Path(text)
    return str(path if path.is_absolute() else (base or Path.cwd()) / path)


def _mono(array: Any, where: str) -> np.ndarray:
    """A float32 mono waveform in [-1, 1] from a 1-D array, or 2-D with channels on the shorter axis."""
    wav = np.asarray(array)
    if np.issubdtype(wav.dtype, np.integer):
        wav = wav / float(np.iinfo(wav.dtype).max)
    if wav.ndim == 2:
        wav = wav.mean(axis=int(np.argmin(wav.shape)))
    if wav.ndim != 1 or wav.size == 0 or not np.issubdtype(wav.dtype, np.number):
        raise DataFormatError(
            f"{where}: the audio array is not a non-empty mono or multi-channel waveform "
            f"(shape {wav.shape}, dtype {wav.dtype})"
        )
    return wav.astype(np.float32)


def _write_audio(value: Mapping[str, Any], where: str, target: Path | None) -> str:
    """Write audio held in memory (``array`` + ``sampling_rate``, or encoded ``bytes``) as a 16-bit WAV file."""
    if target is None:
        raise DataFormatError(
            f"{where}: the audio is held in memory (an array or bytes, not a file); pass "
            "audio_dir=<folder> to have it written there as WAV files"
        )
    if value.get("array") is not None:
        rate = value.get("sampling_rate")
        if not isinstance(rate, (int, np.integer)) or isinstance(rate, bool) or rate <= 0:
            raise DataFormatError(
                f"{where}: the audio array has no positive integer 'sampling_rate' (got {short(rate)})"
            )
        wav = _mono(value["array"], where)
    else:
        try:
            info = sf.info(io.BytesIO(value["bytes"]))
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise DataFormatError(f"{where}: the audio bytes are not a format soundfile reads ({exc})") from None
        check_duration(where, info)  # before decoding: a small file may decode to hours
        try:
            data, rate = sf.read(io.BytesIO(value["bytes"]), dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise DataFormatError(f"{where}: the audio bytes are not a format soundfile reads ({exc})") from None
        wav = _mono(data.T, where)
    return str(save_wav(target, wav, int(rate)))


def _audio(value: Any, where: str, base: Path | None, target: Path | None) -> Any:
    """The ``wav`` of a row: an absolute path, the path of the WAV file written for in-memory audio, or a waveform
    (an array or tensor, as the library's own rows hold)."""
    if isinstance(value, (str, os.PathLike)):
        return _path(value, base, where)
    if isinstance(value, Mapping):
        if value.get("array") is not None or value.get("bytes") is not None:
            return _write_audio(value, where, target)
        if isinstance(value.get("path"), str):
            return _path(value["path"], base, where)
        raise DataFormatError(
            f"{where}: the audio holds none of 'array', 'bytes', 'path' (keys: {fields_found(value)})"
        )
    if isinstance(value, np.ndarray) or hasattr(value, "dim"):
        return value
    raise DataFormatError(
        f"{where}: the audio is not a path, an HF audio dict or a waveform (got {type(value).__name__} {short(value)})"
    )


def _row(
    item: Any,
    where: str,
    index: int,
    name: str,
    base: Path | None,
    audio_dir: Path | None,
    keys: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One manifest row from a (path, label) pair or a mapping (its audio and label fields ``keys``, else found by
    name); other fields pass through."""
    target = audio_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{index:06d}.wav" if audio_dir else None
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return {"ID": f"{name}{index}", "wav": _audio(item[0], where, base, target), "spk_id": _label(item[1], where)}
    if not isinstance(item, Mapping):
        raise DataFormatError(
            f"{where}: expected a row with audio and label fields or an (audio path, label) pair, "
            f"got {type(item).__name__} {short(item)}"
        )
    audio_key, label_key = keys or (
        _one_field(item, AUDIO_FIELDS, "audio", where),
        _one_field(item, LABEL_FIELDS, "speaker label", where),
    )
    ids = fields_named(item, ID_FIELDS)
    if len(ids) > 1:
        raise DataFormatError(f"{where}: ambiguous ID fields {', '.join(map(repr, ids))}")
    row = {k: v for k, v in item.items() if k not in (audio_key, label_key, *ids)}
    rid = str(item[ids[0]]).strip() if ids and item[ids[0]] is not None else f"{name}{index}"
    return {
        "ID": rid,
        **row,
        "wav": _audio(item[audio_key], where, base, target),
        "spk_id": _label(item[label_key], where),
    }


def _dataset_rows(ds: Any, name: str, audio_dir: Path | None, module: Any) -> list[dict[str, Any]]:
    """Rows of a ``datasets.Dataset``: its ``Audio`` column (else one named as in :data:`AUDIO_FIELDS`), read
    undecoded (bytes or a path, so no audio backend of ``datasets`` is needed), and its label column, a
    ``ClassLabel``'s ids given as their names (as are those of any other ``ClassLabel`` column)."""
    features = ds.features
    typed = [c for c, f in features.items() if isinstance(f, module.Audio)]
    if len(typed) > 1:
        raise DataFormatError(f"{name}: the dataset has several Audio columns ({', '.join(typed)}); keep one")
    audio_key = typed[0] if typed else _one_field(features, AUDIO_FIELDS, "audio", f"{name} (dataset)")
    label_key = _one_field(features, LABEL_FIELDS, "speaker label", f"{name} (dataset)")
    if typed:
        ds = ds.cast_column(audio_key, module.Audio(decode=False))
    names = {c: f.names for c, f in features.items() if isinstance(f, module.ClassLabel)}
    rows = []
    for i, item in enumerate(ds):
        item = {
            k: (names[k][v] if k in names and isinstance(v, int) and 0 <= v < len(names[k]) else v)
            for k, v in item.items()
        }
        rows.append(_row(item, f"{name}[{i}]", i, name, None, audio_dir, (audio_key, label_key)))
    return rows


def _is_manifest(path: Path) -> bool:
    """Whether ``path`` is a CSV whose header has every SpeechBrain manifest column."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            header = {h.strip() for h in next(csv.reader(fh), [])}
    except (UnicodeDecodeError, csv.Error):
        return False  # the general reader reports it
    return set(MANIFEST_COLUMNS) <= header


def read_speech_rows(source: Any, name: str, *, audio_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """A speech forget/retain set as manifest rows, each with ``ID``, ``wav`` (an absolute path) and ``spk_id``.

    ``source``: a SpeechBrain manifest CSV (``ID,duration,wav,start,stop,spk_id``, read by
    :func:`~mmunlearn.data.manifest.read_manifest`: every column as there); a ``.csv``/``.tsv`` with a header naming
    an audio column (:data:`AUDIO_FIELDS`) and a label column (:data:`LABEL_FIELDS`), or a headerless 2-column
    ``path,label`` CSV; ``.json`` (a list, or an object with it under ``"data"``/``"rows"``) or ``.jsonl`` rows with
    the same names; a list of (audio path, label) pairs or of such dicts; a ``datasets.Dataset`` with an ``Audio``
    column and a label column. Field names are case-insensitive; an ``ID``/``id`` field is kept (default
    ``f"{name}{i}"``), other fields pass through. Labels become strings (a ``ClassLabel`` id its name). Audio held in
    memory (HF bytes, or ``{"array", "sampling_rate"}``) is written atomically as 16-bit WAV at its own rate into
    ``audio_dir`` as ``<name>-<row>.wav`` (so give the forget and retain sets different names). Relative paths
    resolve against the file's folder (in-memory sets: the working directory now).

    Raises :class:`~mmunlearn.data.user.files.DataFormatError` (one line: file or set, row, what is wrong) for a
    missing or ambiguous column (listing the fields found), an unreadable file or audio, duplicate IDs and an empty
    set; :class:`~mmunlearn.data.manifest.ManifestError` listing every row whose audio file is missing, not regular,
    not readable or not audio (:func:`~mmunlearn.data.manifest.check_rows`).
    """
    target = Path(audio_dir).absolute() if audio_dir is not None else None
    module = dataset_module(source)
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else name
    if module is not None and isinstance(source, module.Dataset):
        rows = _dataset_rows(source, name, target, module)
    elif isinstance(source, (str, os.PathLike)) and _is_manifest(Path(source)):
        rows = read_manifest(source)
        for i, row in enumerate(rows):
            row["wav"] = _path(row["wav"], Path(source).absolute().parent, f"{source} row {i + 1} ({row.get('ID')})")
    else:
        items, base = source_items(source, name, text=False)
        rows = [_row(item, where, i, name, base, target) for i, (where, item) in enumerate(items)]
    if not rows:
        raise DataFormatError(f"{label}: the {name} set is empty")
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row["ID"] in seen:
            raise DataFormatError(f"{label}: rows {seen[row['ID']]} and {i} share the ID {row['ID']!r}")
        seen[row["ID"]] = i
    check_rows(rows, label, required=("ID", "wav", "spk_id"))
    return rows
