"""Decoding a preparation's audio files to 16 kHz mono wav, cached in ``audio_index.json`` (the decode cache)."""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import soundfile as sf

from data_prep.voxceleb2_inputs import Source
from mmunlearn.data.audio import AudioError, read_audio, save_wav
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.progress import StageBar

log = logging.getLogger(__name__)

SR = 16000
#: A source file larger than this, or longer than :data:`MAX_SOURCE_SECONDS`, is left out unread (reported like an
#: unreadable one) instead of being decoded into memory: a 4 GiB (sparse) wav header is not a recording of a speaker
MAX_SOURCE_BYTES = 2 << 30
MAX_SOURCE_SECONDS = 2 * 3600


def _info(path: str) -> Any:
    """``sf.info`` of a wav/flac, None when its header does not read (decoding then says what is wrong)."""
    try:
        return sf.info(path)
    except RuntimeError:
        return None


def _convert_one(src: Source, wav_dir: Path, cached: dict | None) -> dict:
    """Decode/validate one file; returns its index entry (``wav`` + ``frames``, or ``error``)."""
    key = {"size": src.size, "mtime_ns": src.mtime_ns}
    if (
        cached
        and all(cached.get(k) == v for k, v in key.items())
        and ("error" in cached or Path(cached.get("wav", "")).is_file())
    ):
        return cached
    try:
        suffix = Path(src.path).suffix.lower()
        info = _info(src.path) if suffix in (".wav", ".flac") else None
        seconds = info.frames / max(info.samplerate, 1) if info is not None else 0.0
        if src.size > MAX_SOURCE_BYTES or seconds > MAX_SOURCE_SECONDS:
            raise ValueError(
                f"{src.path}: {src.size:,} bytes, {seconds:.0f} s: larger than {MAX_SOURCE_BYTES >> 30} "
                f"GiB or longer than {MAX_SOURCE_SECONDS} s, left out undecoded"
            )
        wav = read_audio(src.path, SR)
        if info is not None and info.samplerate == SR and info.channels == 1:
            return {**key, "wav": src.path, "frames": int(wav.size)}
        dst = wav_dir / src.spk_id / src.video / f"{src.utt}.wav"
        save_wav(dst, wav, SR)
        return {**key, "wav": str(dst), "frames": int(wav.size)}
    except (AudioError, RuntimeError, ValueError) as exc:  # unreadable/silent/empty: report, go on
        return {**key, "error": str(exc)}


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
            raise ValueError(
                f"{path} is corrupt ({problem}); rerun with --force to discard it and decode the audio again"
            )
        log.warning("%s is corrupt (%s): discarded, decoding the audio again", path, problem)
        return {}
    return {k: v for k, v in index.items() if _index_entry_ok(v)}


def _decode_all(todo: list[Source], out: Path, jobs: int, progress: bool, index: dict[str, dict]) -> list[dict]:
    """Decode/validate every file (threads; cached in audio_index.json); one entry per file."""
    index_path = out / "audio_index.json"
    workers = jobs or min(4, os.cpu_count() or 1)
    # Threads, not processes: FFmpeg, libsndfile and scipy drop the GIL for much of the work,
    # and no worker has to re-import torch.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        work = pool.map(lambda s: _convert_one(s, out / "wav", index.get(s.path)), todo)
        entries = list(StageBar(work, total=len(todo), unit="file", desc="decoding audio", disable=not progress))
    index.update({src.path: entry for src, entry in zip(todo, entries)})
    _write_json(index_path, index)
    return entries
