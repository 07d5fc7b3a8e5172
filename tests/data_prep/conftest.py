"""Fixtures for the speech data-prep tests: one tiny synthetic corpus per session
(4 speakers x 6 utterances x 2 videos)."""

import pytest

from data_prep.synth_speakers import synthesize_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The seed-0 corpus; tests must not modify it (copy it first)."""
    return synthesize_corpus(tmp_path_factory.mktemp("synth") / "vox", 4, 6, 2, seed=0, progress=False)
