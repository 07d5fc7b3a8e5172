"""Audio I/O: wav/m4a to 16 kHz mono, segments, clear AudioErrors naming the file, atomic save_wav."""

import numpy as np
import pytest
import soundfile as sf
import torch

from mmunlearn.data.audio import AudioError, load_audio, read_audio, resample, save_wav
from tests.data_prep.audio_files import tone, write_m4a


def peak_hz(wav: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(wav * np.hanning(len(wav))))
    return float(np.fft.rfftfreq(len(wav), 1 / sr)[np.argmax(spec)])


def test_stereo_44k_wav_becomes_16k_mono(tmp_path):
    left, right = tone(440, 1.0, 44100), tone(440, 1.0, 44100, amp=0.1)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), 44100, subtype="FLOAT")
    wav = load_audio(path)
    assert isinstance(wav, torch.Tensor) and wav.dtype == torch.float32 and wav.ndim == 1
    assert wav.numel() == 16000  # 44100 samples * 160/441
    assert peak_hz(wav.numpy(), 16000) == pytest.approx(440, abs=2)
    # mono = channel mean: amplitude (0.3 + 0.1) / 2, away from the filter's edges
    assert float(wav[2000:14000].abs().max()) == pytest.approx(0.2, abs=0.01)


def test_m4a_at_22k_becomes_16k(tmp_path):
    path = write_m4a(tmp_path / "a.m4a", tone(440, 1.0, 22050), 22050)
    wav = read_audio(path)
    assert wav.dtype == np.float32 and wav.ndim == 1
    # AAC adds encoder priming/padding (under 3 frames of 1024 at 22.05 kHz)
    assert 16000 <= wav.size <= 16000 + 3 * 1024 * 16000 // 22050 + 1
    assert peak_hz(wav, 16000) == pytest.approx(440, abs=3)
    assert 0.2 < np.abs(wav).max() < 0.4


def test_segment_matches_slice_of_whole_file(tmp_path):
    path = tmp_path / "s.wav"
    save_wav(path, tone(300, 1.0, 16000), 16000)
    whole = read_audio(path)
    np.testing.assert_array_equal(read_audio(path, start=1000, stop=5000), whole[1000:5000])
    m4a = write_m4a(tmp_path / "s.m4a", tone(300, 1.0, 16000), 16000)
    np.testing.assert_array_equal(read_audio(m4a, start=100, stop=900), read_audio(m4a)[100:900])
    with pytest.raises(AudioError, match="beyond"):
        read_audio(path, start=15000, stop=17000)
    with pytest.raises(ValueError, match="bad segment"):
        read_audio(path, start=10, stop=5)


def test_errors_name_the_file(tmp_path):
    with pytest.raises(AudioError, match="missing.wav: file not found"):
        load_audio(tmp_path / "missing.wav")
    for name in ("garbage.m4a", "garbage.wav"):
        bad = tmp_path / name
        bad.write_bytes(b"\x00\x17not audio" * 50)
        with pytest.raises(AudioError, match=f"{name}: unreadable") as err:
            load_audio(bad)
        assert err.value.path == str(bad)
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.full(16000, 5e-5, np.float32), 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="silent.wav: silent file"):
        load_audio(silent)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match="empty.wav: empty audio"):
        load_audio(empty)
    # a quiet but real signal (peak 1e-3) is not silent
    quiet = tmp_path / "quiet.wav"
    sf.write(quiet, tone(200, 0.5, 16000, amp=1e-3), 16000, subtype="FLOAT")
    assert load_audio(quiet).abs().max() > 5e-4


def test_save_wav_atomic_roundtrip_and_checks(tmp_path):
    x = tone(250, 0.5, 16000)
    x[10] = 1.7  # clipped to 1
    path = save_wav(tmp_path / "sub" / "out.wav", torch.from_numpy(x), 16000)
    info = sf.info(path)
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    y = read_audio(path)
    assert y[10] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose(np.delete(y, 10), np.delete(x, 10), atol=1 / 32768 + 1e-7)
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.wav"]  # no temp file left
    with pytest.raises(ValueError, match="1-D mono"):
        save_wav(tmp_path / "bad.wav", np.zeros((2, 10)), 16000)
    assert not (tmp_path / "bad.wav").exists()


def test_resample_lengths_exact():
    assert resample(np.ones(22050, np.float32), 22050, 16000).size == 16000
    assert resample(np.ones(48000, np.float32), 48000, 16000).size == 16000
    x = np.arange(5, dtype=np.float32)
    assert resample(x, 16000, 16000) is not None and np.array_equal(resample(x, 16000, 16000), x)
    with pytest.raises(ValueError, match="positive"):
        resample(x, 0, 16000)
