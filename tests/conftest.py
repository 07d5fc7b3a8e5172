"""Shared test setup: import mmunlearn first (it makes torchaudio/SpeechBrain importable on a CPU torch)."""

import mmunlearn  # noqa: F401  (must precede transformers / torchaudio / speechbrain imports)
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
