"""Shared test setup: import mmunlearn first (it makes torchaudio/SpeechBrain importable on a CPU torch);
one torch thread (tiny models are overhead-bound, and two threads spin-wait badly on a busy 2-core machine)."""

import pytest
import torch

import mmunlearn  # noqa: F401  (must precede transformers / torchaudio / speechbrain imports)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
