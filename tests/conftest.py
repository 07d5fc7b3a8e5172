"""Shared test setup: import mmunlearn first (it makes torchaudio/SpeechBrain importable on a CPU torch);
one torch thread (tiny models are overhead-bound, and two threads spin-wait badly on a busy 2-core machine);
the model cache in a folder of the tests' own (the suite never writes into a user's ~/.cache/mmunlearn: a model a
user built must not be replaced or read by a test), shared by the xdist workers and kept between runs."""

import os
import tempfile
from pathlib import Path

import pytest
import torch

import mmunlearn  # noqa: F401  (must precede transformers / torchaudio / speechbrain imports)

torch.set_num_threads(1)
TEST_CACHE = Path(tempfile.gettempdir()) / f"mmunlearn-tests-{os.getuid()}" / "models"
os.environ["MMUNLEARN_CACHE"] = str(TEST_CACHE)  # before any test runs, so subprocesses inherit it too


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
