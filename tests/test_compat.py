"""torchaudio's pure-Python parts and SpeechBrain import and run beside a CPU-only torch."""

import subprocess
import sys

import pytest
import torch

from mmunlearn import _compat


def test_torchaudio_pure_python_parts_work():
    import torchaudio
    from torchaudio.compliance import kaldi

    wav = torch.randn(1, 16000)
    assert kaldi.fbank(wav, num_mel_bins=40).shape == (98, 40)
    assert torchaudio.functional.resample(torch.randn(1, 22050), 22050, 16000).shape == (1, 16000)
    assert torchaudio.transforms.MelSpectrogram(16000, n_mels=32)(wav).shape[1] == 32


def test_speechbrain_ecapa_runs_on_cpu():
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    emb = ECAPA_TDNN(40, channels=[16, 16, 16, 16, 48], lin_neurons=8)
    feats = Fbank(n_mels=40)(torch.randn(2, 8000))
    assert emb(feats).shape == (2, 1, 8)


def test_transformers_audio_feature_extractor_imports():
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    out = fe([torch.randn(16000).numpy()], sampling_rate=16000, return_tensors="pt")
    assert out["input_features"].shape[1] == 80


@pytest.mark.skipif(_compat.TORCHAUDIO_NATIVE_ERROR is None, reason="torchaudio's native extension loads here")
def test_stub_only_when_native_extension_fails_and_it_says_why():
    import torchaudio._extension as ext

    assert ext._MMUNLEARN_STUB and not ext._IS_TORCHAUDIO_EXT_AVAILABLE
    with pytest.raises(RuntimeError, match="native extension"):
        ext.fail_if_no_align(lambda: None)()
    # without mmunlearn the same import fails: the patch is what makes it work
    bare = subprocess.run([sys.executable, "-c", "import torchaudio"], capture_output=True, text=True)
    assert bare.returncode != 0 and "libc10_cuda" in bare.stderr
    fixed = subprocess.run(
        [sys.executable, "-c", "import mmunlearn, torchaudio, speechbrain"], capture_output=True, text=True
    )
    assert fixed.returncode == 0, fixed.stderr


def test_patch_is_idempotent():
    assert _compat.patch_torchaudio() == (_compat.TORCHAUDIO_NATIVE_ERROR is not None)
