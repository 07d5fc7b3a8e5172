"""Fixtures the recipe tests share: the TOFU `micro` world built once per test session."""

from __future__ import annotations

import pytest

from recipes.tofu import pipeline as tofu_pipeline
from recipes.tofu.config import TofuConfig

#: the synthetic TOFU data of the micro-preset tests (10 authors)
TOFU_DATA = "synthetic:n_authors=10"


@pytest.fixture(scope="session")
def tofu_micro(tmp_path_factory):
    """The micro preset's base, target and retain models on :data:`TOFU_DATA` (forget10), with their reference
    evaluations, in one cache folder: built once for test_tofu and test_tofu_options (about 45 s each on 2 cores).
    Tests may build other models into the same cache (their options give other keys) but never change these."""
    cache = tmp_path_factory.mktemp("tofu_micro_cache")
    return tofu_pipeline.prepare(
        TofuConfig(
            preset="micro",
            data=TOFU_DATA,
            forget_split="forget10",
            seed=0,
            cache_dir=cache,
            device="cpu",
            max_new_tokens=24,
        )
    )
