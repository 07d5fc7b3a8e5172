"""What a VoxCeleb2-layout tree holds before preparation: its audio files (:class:`Source`,
:func:`scan_voxceleb`) and its side files (``vox2_meta.csv``, ``transcripts.csv``), read and checked before any
audio is decoded (:mod:`data_prep.voxceleb2` prepares from them)."""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mmunlearn.progress import StageBar

#: Audio suffixes looked for, in order of preference when one utterance exists in several.
AUDIO_SUFFIXES = (".wav", ".flac", ".m4a", ".aac", ".mp4", ".ogg", ".opus", ".mp3")
_SPEAKER_DIR = re.compile(r"^id\d+$")


@dataclass(frozen=True)
class Source:
    """One audio file found in the tree."""

    spk_id: str
    video: str
    utt: str
    path: str
    subset: str  # dev or test
    size: int = 0
    mtime_ns: int = 0

    @property
    def id(self) -> str:
        return f"{self.spk_id}--{self.video}--{self.utt}"


def scan_voxceleb(
    root: str | os.PathLike,
    sets: Sequence[str] | None = None,
    exclude: str | os.PathLike | None = None,
    progress: bool = False,
) -> tuple[list[Source], int]:
    """Audio files ``.../idNNNNN/<video>/<utt>.<ext>`` under ``root`` (skipping ``exclude``).

    The subset is the first folder under ``root`` when it is ``dev`` or ``test`` (else ``dev``);
    ``sets`` keeps only those. When one utterance exists in several formats, the first suffix of
    :data:`AUDIO_SUFFIXES` wins. Returns the sources sorted by ID and the number of duplicates.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"VoxCeleb2 root {root} is not a folder")
    skip = Path(exclude).resolve() if exclude else None
    found: dict[str, tuple[int, Source]] = {}
    dups = 0
    walk = StageBar(os.walk(root), unit="dir", desc="scanning", disable=not progress)
    for dirpath, dirnames, filenames in walk:
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            dirnames[:] = []
            continue
        dirnames.sort()
        if not _SPEAKER_DIR.match(here.parent.name):
            continue
        rel = here.relative_to(root).parts
        subset = rel[0] if rel and rel[0] in ("dev", "test") else "dev"
        if sets is not None and subset not in sets:
            continue
        for name in sorted(filenames):
            suffix = Path(name).suffix.lower()
            if suffix not in AUDIO_SUFFIXES or name.startswith("."):
                continue
            try:
                st = os.stat(here / name)
            except OSError:  # vanished or dangling link: nothing to read
                continue
            src = Source(
                here.parent.name, here.name, Path(name).stem, str(here / name), subset, st.st_size, st.st_mtime_ns
            )
            rank = AUDIO_SUFFIXES.index(suffix)
            if src.id in found:
                dups += 1
                if found[src.id][0] <= rank:
                    continue
            found[src.id] = (rank, src)
    return [found[k][1] for k in sorted(found)], dups


def _read_csv_rows(path: Path, what: str) -> list[list[str]]:
    """All rows of a CSV side file (header first); an error naming the file when it cannot be read."""
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} not found")
    if not path.is_file():
        raise ValueError(f"{path}: the {what} is not a regular file (a device, FIFO or folder)")
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            return list(csv.reader(fh))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: the {what} is not UTF-8 text ({exc})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: the {what} is not a readable CSV file ({exc})") from None


def read_vox_meta(path: str | os.PathLike, allow_no_gender: bool = False) -> dict[str, dict[str, str]]:
    """``vox2_meta.csv`` as ``{id: {"vggface2_id", "gender", "set"}}``, stray spaces stripped.

    ValueError naming the file when it is not UTF-8 CSV, has no ``VoxCeleb2 ID`` column, or has no
    ``Gender`` column (unless ``allow_no_gender``: the records then have no ``gender``).
    """
    path = Path(path)
    names = {"voxceleb2 id": "id", "vggface2 id": "vggface2_id", "gender": "gender", "set": "set"}
    rows = _read_csv_rows(path, "VoxCeleb2 meta file")
    header = [h.strip().lower() for h in (rows[0] if rows else [])]
    if "voxceleb2 id" not in header:
        raise ValueError(f"{path}: no 'VoxCeleb2 ID' column in header {header}")
    if "gender" not in header and not allow_no_gender:
        raise ValueError(
            f"{path}: no 'Gender' column (columns found: {header}), so every gender would be "
            "empty; pass allow_no_gender=True (--allow-no-gender) to prepare without genders"
        )
    recs = [{names.get(h, h): v.strip() for h, v in zip(header, row)} for row in rows[1:]]
    return {r.pop("id"): r for r in recs if r.get("id")}


def read_transcripts(path: str | os.PathLike) -> dict[str, str]:
    """``transcripts.csv`` (``ID``, ``text`` columns, as the synthetic corpus has): ID -> text."""
    path = Path(path)
    rows = _read_csv_rows(path, "transcripts file")
    header = [h.strip() for h in (rows[0] if rows else [])]
    if not {"ID", "text"} <= set(header):
        raise ValueError(f"{path}: transcripts need columns ID and text, got {header}")
    recs = [dict(zip(header, row)) for row in rows[1:]]
    return {r["ID"].strip(): r.get("text", "").strip() for r in recs if r.get("ID", "").strip()}
