"""Audio I/O without torchaudio: wav/flac (soundfile), m4a and the rest (PyAV) to mono 16 kHz; atomic wav writes.

Resampling uses :func:`scipy.signal.resample_poly` (exact rational polyphase filter): scipy is a
core dependency, the result is deterministic, it runs on numpy arrays (worker processes need no
torch or torchaudio import-order care) and every integer rate pair (22050->16000 is 320/441) is
exact. A file is *silent* when its peak absolute amplitude is below :data:`SILENCE_PEAK` (1e-4,
i.e. -80 dBFS): digital silence or a dead channel, never a quiet recording.
"""

from __future__ import annotations

import os
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from scipy.signal import resample_poly

from mmunlearn.errors import UserError
from mmunlearn.files.atomic import atomic_path

#: Peak absolute amplitude (on the [-1, 1] scale) below which audio counts as silent.
SILENCE_PEAK = 1e-4
#: Rate every manifest and model in this project uses.
DEFAULT_SR = 16000
#: Suffixes libsndfile reads natively; everything else goes through PyAV (FFmpeg).
SOUNDFILE_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".aiff", ".aif"})


class AudioError(UserError, RuntimeError):
    """A file could not be used as audio: missing, unreadable, empty or silent. Names the file (a user error:
    the command line prints it as one ``error:`` line)."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def resample(wav: np.ndarray, orig_sr: int, sr: int) -> np.ndarray:
    """Resample a 1-D float array from ``orig_sr`` to ``sr`` Hz (polyphase, float32 out)."""
    if orig_sr <= 0 or sr <= 0:
        raise ValueError(f"sample rates must be positive, got orig_sr={orig_sr}, sr={sr}")
    if orig_sr == sr:
        return np.asarray(wav, dtype=np.float32)
    g = gcd(int(orig_sr), int(sr))
    return resample_poly(wav, int(sr) // g, int(orig_sr) // g).astype(np.float32)


#: The longest audio a file may decode to, in seconds: its header (or the decoder, for formats without one) is read
#: first, so a small file that decodes to hours is refused before the samples are allocated.
MAX_AUDIO_SECONDS = 2 * 3600


def _too_long(path: Path, seconds: float) -> AudioError:
    return AudioError(
        path,
        f"decodes to {seconds / 3600:.1f} hours of audio, more than the "
        f"{MAX_AUDIO_SECONDS / 3600:g} a clip may have (cut it, or split it into segments)",
    )


def check_duration(path: str | os.PathLike, info: Any) -> None:
    """Refuse audio whose soundfile header (``info``: frames, samplerate) says it is longer than
    :data:`MAX_AUDIO_SECONDS`."""
    rate = int(info.samplerate)
    if rate > 0 and info.frames / rate > MAX_AUDIO_SECONDS:
        raise _too_long(Path(path), info.frames / rate)


def _read_soundfile(path: Path) -> tuple[np.ndarray, int]:
    check_duration(path, sf.info(str(path)))
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return data.mean(axis=1), int(rate)


def _read_av(path: Path) -> tuple[np.ndarray, int]:
    import av  # deferred: only m4a/aac/... inputs need FFmpeg

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise AudioError(path, "no audio stream")
        stream = container.streams.audio[0]
        rate = int(stream.codec_context.sample_rate or 0)
        chunks, decoded = [], 0
        for frame in container.decode(stream):
            arr = frame.to_ndarray()
            if frame.format.is_planar:  # (channels, samples)
                chunks.append(arr.astype(np.float32).mean(axis=0))
            else:  # packed: (1, samples * channels), interleaved
                n_ch = len(frame.layout.channels)
                chunks.append(arr.reshape(-1, n_ch).astype(np.float32).mean(axis=1))
            rate = rate or int(frame.sample_rate)
            kind = frame.format.name.rstrip("p")
            decoded += chunks[-1].size
            if rate and decoded / rate > MAX_AUDIO_SECONDS:
                raise _too_long(path, decoded / rate)
    if not chunks:
        return np.zeros(0, dtype=np.float32), rate
    wav = np.concatenate(chunks)
    # Integer sample formats come back as raw integers: scale them to [-1, 1].
    if kind == "u8":
        wav = (wav - 128.0) / 128.0
    elif kind in ("s16", "s32", "s64"):
        wav = wav / float(2 ** (int(kind[1:]) - 1))
    return wav.astype(np.float32), rate


def _check(path: Path, wav: np.ndarray, what: str) -> None:
    if wav.size == 0:
        raise AudioError(path, f"empty audio ({what} has no samples)")
    if not np.all(np.isfinite(wav)):
        raise AudioError(path, f"non-finite samples in {what}")
    peak = float(np.max(np.abs(wav)))
    if peak < SILENCE_PEAK:
        raise AudioError(path, f"silent {what} (peak {peak:.2e} < {SILENCE_PEAK:g})")


def read_audio(path: str | os.PathLike, sr: int = DEFAULT_SR, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Decode ``path`` to a mono float32 numpy array at ``sr`` Hz.

    ``start``/``stop`` select samples ``[start, stop)`` at the *target* rate (manifest segments).
    A wav/flac already at ``sr`` is read by seeking; any other file is decoded whole, resampled,
    then sliced. Raises :class:`AudioError` (naming the file) when the file is missing,
    unreadable, empty, silent, or the segment lies outside it.
    """
    path = Path(path)
    if start < 0 or (stop is not None and stop <= start):
        raise ValueError(f"{path}: bad segment start={start} stop={stop}")
    if not path.is_file():
        raise AudioError(path, "file not found")
    try:
        if path.suffix.lower() in SOUNDFILE_SUFFIXES:
            info = sf.info(str(path))
            if stop is None:
                check_duration(path, info)
            if int(info.samplerate) == sr and (start or stop is not None):
                data, _ = sf.read(str(path), start=start, stop=stop, dtype="float32", always_2d=True)
                wav = data.mean(axis=1)
                if stop is not None and start + wav.size < stop:
                    raise AudioError(path, f"segment [{start}, {stop}) beyond {info.frames} samples")
                _check(path, wav, f"segment [{start}, {stop})")
                return wav.astype(np.float32)
            wav, rate = _read_soundfile(path)
        else:
            wav, rate = _read_av(path)
    except AudioError:
        raise
    except Exception as exc:  # soundfile / FFmpeg raise many types; all mean "unreadable"
        raise AudioError(path, f"unreadable ({type(exc).__name__}: {exc})") from exc
    if rate <= 0:
        raise AudioError(path, "unknown sample rate")
    if sr <= 0:
        raise ValueError(f"{path}: cannot be read at {sr} Hz: the rate asked for (the model's) must be positive")
    _check(path, wav, "file")
    wav = resample(wav, rate, sr)
    if start or stop is not None:
        if stop is not None and stop > wav.size:
            raise AudioError(path, f"segment [{start}, {stop}) beyond {wav.size} samples")
        wav = wav[start:stop]
        _check(path, wav, f"segment [{start}, {stop})")
    return wav


def load_audio(path: str | os.PathLike, sr: int = DEFAULT_SR, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Decode ``path`` to a 1-D mono float32 tensor at ``sr`` Hz (see :func:`read_audio`)."""
    return torch.from_numpy(np.ascontiguousarray(read_audio(path, sr, start, stop)))


def save_wav(path: str | os.PathLike, wav: np.ndarray | torch.Tensor, sr: int) -> Path:
    """Write mono audio in [-1, 1] as 16-bit PCM wav, atomically (temp file + rename).

    Values outside [-1, 1] are clipped. Returns the path written.
    """
    path = Path(path)
    if isinstance(wav, torch.Tensor):
        wav = wav.detach().cpu().numpy()
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"{path}: save_wav wants 1-D mono audio, got shape {tuple(wav.shape)}")
    if sr <= 0:
        raise ValueError(f"{path}: sample rate must be positive, got {sr}")
    with atomic_path(path) as tmp:
        sf.write(tmp, np.clip(wav, -1.0, 1.0), sr, subtype="PCM_16", format="WAV")
    return path
