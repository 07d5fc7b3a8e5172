"""A tiny synthetic speaker corpus and its manifests, built once per test session (shared by the speaker tests)."""

from pathlib import Path

import pytest
import torch

from data_prep.synth_speakers import synthesize_corpus
from data_prep.voxceleb2 import prepare

_BUILT: dict[tuple, Path] = {}


def _manifests(tmp_path_factory, speakers: int, forget_speakers: int) -> Path:
    """Manifests of ``speakers`` espeak speakers x 8 utterances x 2 videos, ``forget_speakers`` of them to forget,
    25 % sample forget; built once per session and size."""
    # Imported into several test modules, a fixture gets one definition (and one session cache)
    # per module: memoise here so each corpus is built once per session.
    key = (id(tmp_path_factory), speakers, forget_speakers)
    if key not in _BUILT:
        base = tmp_path_factory.mktemp(f"speaker_corpus_{speakers}_{forget_speakers}")
        root = synthesize_corpus(base / "vox", speakers=speakers, utterances=8, videos=2, seed=0, progress=False)
        _BUILT[key] = prepare(
            root, base / "manifests", forget_speakers=forget_speakers, forget_fraction=0.25, progress=False
        ).out
    return _BUILT[key]


@pytest.fixture(scope="session")
def speaker_manifests(tmp_path_factory) -> Path:
    """Manifest directory of 4 espeak speakers x 8 utterances x 2 videos: 1 forget speaker, 25 % sample forget.

    Tests must not modify it.
    """
    return _manifests(tmp_path_factory, 4, 1)


@pytest.fixture(scope="session")
def three_forgotten_manifests(tmp_path_factory) -> Path:
    """7 espeak speakers x 8 utterances x 2 videos, 3 of them to forget (tests of every forgotten speaker)."""
    return _manifests(tmp_path_factory, 7, 3)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread while a speaker test module runs (restored after).

    On a shared 2-core machine ECAPA's many small convolutions run ~20x slower with 2 threads
    than with 1 when the other core is busy (the threads wait on each other).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llm_dir(speaker_manifests, tmp_path_factory) -> Path:
    """A tiny random-init Qwen2.5-Omni-thinker-shaped speech LLM saved to a folder, with a tokenizer
    trained on the corpus's spoken-QA texts. Tests must not modify it."""
    from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
    from mmunlearn.data.utterances import split_rows
    from mmunlearn.speech.spoken_qa import spoken_qa, texts_of

    texts = texts_of(spoken_qa(split_rows(speaker_manifests, "train"), ("speaker", "gender")))
    path = tmp_path_factory.mktemp("speech_llm") / "llm"
    SpeechLLMAdapter.build("tiny", texts=texts, family="qwen2_5_omni", seed=0).save(path)
    return path
