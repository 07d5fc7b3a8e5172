"""Utterances of speech manifests: a manifest-backed dataset of decoded waveforms,
optionally as seeded random fixed-length crops.

Training draws a fresh crop of each utterance every time it is read; the crop offsets are a pure
function of ``(seed, index, how often that index was read)``, so a run that reads the items in
the same order (the shared training loop's order is a function of its seed) sees the same crops.
Without ``crop_seconds`` an item is the whole row (full utterance or manifest segment).

>>> ds = UtteranceDataset([{"ID": "a", "spk_id": "s1", "wav": torch.arange(48000.0)}], crop_seconds=1.0)
>>> item = ds[0]
>>> sorted(item), item["wav"].shape
(['ID', 'spk_id', 'wav'], torch.Size([16000]))
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from mmunlearn.data.audio import DEFAULT_SR
from mmunlearn.data.manifest import check_rows, read_manifest
from mmunlearn.data.waveforms import AudioCache, crop, example_waveform


class UtteranceDataset(Dataset):
    """``rows`` (manifest dicts or decoded examples) as ``{"ID", "spk_id", "wav": 1-D float32 tensor}``.

    ``crop_seconds``: a random window of that length per read (shorter utterances come whole);
    None: the whole row. ``cache``: an :class:`AudioCache` (True: a new one; None/False: decode on
    every read). The rows are not modified.
    """

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        crop_seconds: float | None = None,
        seed: int = 0,
        cache: AudioCache | bool | None = True,
        sr: int = DEFAULT_SR,
    ):
        if len(rows) == 0:
            raise ValueError("UtteranceDataset: no rows given")
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or "wav" not in row or "spk_id" not in row:
                raise ValueError(f"row {i} needs 'wav' and 'spk_id' entries: {row!r:.120}")
        if crop_seconds is not None and not crop_seconds > 0:
            raise ValueError(f"crop_seconds must be positive or None, got {crop_seconds!r}")
        self.rows = list(rows)
        self.crop_samples = None if crop_seconds is None else max(1, int(round(crop_seconds * sr)))
        self.seed, self.sr = int(seed), sr
        self.cache = AudioCache() if cache is True else (cache or None)
        self._reads = np.zeros(len(self.rows), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def speakers(self) -> list[str]:
        """Sorted speaker IDs present in the rows."""
        return sorted({str(r["spk_id"]) for r in self.rows})

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        wav = example_waveform(row, self.cache, self.sr)
        if self.crop_samples is not None:
            rng = np.random.default_rng([self.seed, int(index), int(self._reads[index])])
            self._reads[index] += 1
            wav = crop(wav, self.crop_samples, rng)
        return {"ID": str(row.get("ID", index)), "spk_id": str(row["spk_id"]), "wav": wav}

    def reset_crops(self) -> None:
        """Forget how often each item was read, so the crop sequence starts over."""
        self._reads[:] = 0


def rows_by_speaker(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Rows grouped by ``spk_id`` (sorted speaker IDs, rows in input order)."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row["spk_id"]), []).append(row)
    return dict(sorted(out.items()))


def draw_balanced(rows: Sequence[Mapping[str, Any]], n: int, seed: int = 0) -> list[Mapping[str, Any]]:
    """``n`` of ``rows`` drawn evenly over speakers by ``seed`` (each speaker's rows shuffled, then taken round
    robin in the order speakers first appear); all of them, in order, when ``n`` is 0 or at least their number."""
    if not n or n >= len(rows):
        return list(rows)
    rng = random.Random(seed)
    by_spk: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_spk.setdefault(str(row["spk_id"]), []).append(row)
    for group in by_spk.values():
        rng.shuffle(group)
    order = [g[i] for i in range(max(map(len, by_spk.values()))) for g in by_spk.values() if i < len(g)]
    return order[:n]


def durations(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Length of each row in samples (from ``start``/``stop``; decoded examples: their waveform)."""
    out = []
    for row in rows:
        wav = row.get("wav")
        if isinstance(wav, (torch.Tensor, np.ndarray)):
            out.append(int(len(wav)))
        elif row.get("stop") not in (None, ""):
            out.append(int(row["stop"]) - int(row.get("start", 0) or 0))
        else:
            out.append(int(round(float(row.get("duration", 0.0)) * DEFAULT_SR)))
    return out


Manifests = str | os.PathLike | Mapping[str, Any]
#: Forgetting levels of the VoxCeleb2 recipe: whole speakers, or individual training utterances.
LEVELS = ("speaker", "sample")


def manifest_paths(manifests: Manifests) -> dict[str, Path]:
    """Split name -> CSV path: every ``*.csv`` of a directory, or a mapping's path values."""
    if isinstance(manifests, Mapping):
        return {k: Path(v) for k, v in manifests.items() if isinstance(v, (str, os.PathLike))}
    root = Path(manifests)
    if not root.is_dir():
        raise FileNotFoundError(f"manifest directory not found: {root}")
    return {p.stem: p for p in root.glob("*.csv")}


def split_rows(manifests: Manifests, name: str, *, root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """Rows of split ``name`` (e.g. ``spk_retain_test``) of ``prepare``'s manifests: a directory, or a
    mapping from split names to CSV paths or to lists of rows.

    Every row is checked before it is returned (:func:`~mmunlearn.data.manifest.check_rows`): a
    manifest row or a given row whose ``wav`` path is missing, not a regular readable audio file, or
    (with ``root``) outside ``root`` fails here with one error listing the bad rows, not mid-training.
    """
    if isinstance(manifests, Mapping) and name in manifests and not isinstance(manifests[name], (str, os.PathLike)):
        rows = [dict(r) for r in manifests[name]]
        check_rows(rows, f"{name!r} rows", root=root)
        return rows
    paths = manifest_paths(manifests)
    if name not in paths:
        raise FileNotFoundError(f"no {name!r} manifest among {sorted(paths)}")
    return read_manifest(paths[name], check_files=True, root=root)
