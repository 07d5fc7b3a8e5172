"""A small audio file that decodes to hours is refused from its header, before the samples are allocated: a FLAC
in a manifest or (path, label) list, and the same FLAC as ``datasets`` Audio bytes (no WAV is written into
``audio_dir``, nothing is left behind)."""

from __future__ import annotations

import hashlib
import os
import tracemalloc

import numpy as np
import pytest
import soundfile as sf

import mmunlearn.data.audio as audio
from mmunlearn.data.audio import AudioError, read_audio
from mmunlearn.data.user.speech import read_speech_rows

SR = 8000


@pytest.fixture
def long_flac(tmp_path, monkeypatch):
    """Ten minutes of quiet noise as FLAC, with the cap lowered to one minute (the real cap is two hours: a file
    over it takes seconds to build)."""
    monkeypatch.setattr(audio, "MAX_AUDIO_SECONDS", 60)
    path = tmp_path / "long.flac"
    rng = np.random.default_rng(0)
    with sf.SoundFile(path, "w", samplerate=SR, channels=1, format="FLAC") as f:
        for _ in range(10):
            f.write((0.01 * rng.standard_normal(SR * 60)).astype(np.float32))
    return path


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_file_that_decodes_to_hours_is_refused_from_its_header(long_flac):
    before = hashlib.sha256(long_flac.read_bytes()).hexdigest()

    def read():
        with pytest.raises(AudioError, match=r"long\.flac: decodes to 0\.2 hours of audio, more than"):
            read_audio(long_flac, sr=16000)

    assert _peak(read) < 4 << 20  # ten minutes decoded and resampled would be 38 MB
    assert hashlib.sha256(long_flac.read_bytes()).hexdigest() == before


def test_the_same_audio_as_dataset_bytes_writes_nothing(long_flac, tmp_path):
    audio_dir = tmp_path / "audio"
    audio_dir.mkdir()
    rows = [{"audio": {"bytes": long_flac.read_bytes(), "path": None}, "speaker": "s1"}]
    with pytest.raises(AudioError, match=r"forget\[0\]: decodes to 0\.2 hours"):
        read_speech_rows(rows, "forget", audio_dir=audio_dir)
    assert os.listdir(audio_dir) == [] and sorted(os.listdir(tmp_path)) == ["audio", "long.flac"]
