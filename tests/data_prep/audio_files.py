"""Test helpers: write small audio files (AAC-in-m4a with PyAV, tones) for the speech data tests."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def tone(freq: float, seconds: float, sr: int, amp: float = 0.3) -> np.ndarray:
    """A sine tone, float32."""
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


def write_m4a(path: Path, wav: np.ndarray, sr: int) -> Path:
    """Encode mono float audio as AAC in an MP4 (.m4a) container, like VoxCeleb2's files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="ipod") as container:
        stream = container.add_stream("aac", rate=sr)
        stream.layout = "mono"
        for i in range(0, len(wav), 1024):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(wav[None, i : i + 1024]), format="fltp", layout="mono"
            )
            frame.sample_rate = sr
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path
