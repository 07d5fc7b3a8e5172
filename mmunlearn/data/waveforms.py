"""Waveforms of manifest rows: loading (with an optional in-memory cache) and seeded fixed-length crops.

A *row* is a manifest dict (``wav`` path, ``start``/``stop`` sample indices at 16 kHz, ``spk_id``,
see :mod:`mmunlearn.data.manifest`) or an already decoded example whose ``wav`` is a 1-D tensor or
numpy array. :func:`example_waveform` turns either into a 1-D float32 tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmunlearn.data.audio import DEFAULT_SR, load_audio


class AudioCache:
    """Decoded waveforms keyed by ``(wav, start, stop)``, kept until ``max_bytes`` are held.

    Once full, new waveforms are decoded on every request (no eviction: the first items stay).
    The built-in corpus (about 0.3 h, ~70 MB as float32) fits in the default 2 GiB.
    """

    def __init__(self, max_bytes: int = 2 << 30):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._store: dict[tuple[str, int, int | None], torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._store)

    def get(self, wav: str, start: int = 0, stop: int | None = None, sr: int = DEFAULT_SR) -> torch.Tensor:
        key = (str(wav), int(start), None if stop is None else int(stop))
        hit = self._store.get(key)
        if hit is not None:
            return hit
        audio = load_audio(wav, sr, key[1], key[2])
        size = audio.numel() * audio.element_size()
        if self.bytes + size <= self.max_bytes:
            self._store[key] = audio
            self.bytes += size
        return audio


def example_waveform(example: Mapping[str, Any], cache: AudioCache | None = None, sr: int = DEFAULT_SR) -> torch.Tensor:
    """1-D float32 waveform of a manifest row (decoded from ``wav``) or a decoded example."""
    if not isinstance(example, Mapping) or "wav" not in example:
        raise ValueError(f"example needs a 'wav' entry (a path or a 1-D waveform): {example!r:.120}")
    wav = example["wav"]
    if isinstance(wav, (str, bytes)) or hasattr(wav, "__fspath__"):
        start, stop = int(example.get("start", 0) or 0), example.get("stop")
        stop = None if stop in (None, "") else int(stop)
        return cache.get(str(wav), start, stop, sr) if cache is not None else load_audio(wav, sr, start, stop)
    tensor = torch.as_tensor(np.asarray(wav) if not isinstance(wav, torch.Tensor) else wav, dtype=torch.float32)
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise ValueError(
            f"example {example.get('ID', '?')!r}: waveform must be non-empty 1-D, got shape {tuple(tensor.shape)}"
        )
    return tensor


def crop(wav: torch.Tensor, length: int, rng: np.random.Generator) -> torch.Tensor:
    """A random window of ``length`` samples (the whole waveform when it is not longer)."""
    if length < 1:
        raise ValueError(f"crop length must be >= 1 sample, got {length}")
    if wav.numel() <= length:
        return wav
    offset = int(rng.integers(0, wav.numel() - length + 1))
    return wav[offset : offset + length]


def segments(wav: torch.Tensor, length: int) -> list[torch.Tensor]:
    """Consecutive windows of ``length`` samples (the remainder dropped); the whole waveform when shorter.

    >>> [s.tolist() for s in segments(torch.arange(7.0), 3)]
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    >>> [s.numel() for s in segments(torch.zeros(2), 3)]
    [2]
    """
    if length < 1:
        raise ValueError(f"segment length must be >= 1 sample, got {length}")
    if wav.numel() <= length:
        return [wav]
    return [wav[i * length : (i + 1) * length] for i in range(wav.numel() // length)]
