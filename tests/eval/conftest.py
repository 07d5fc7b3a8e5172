"""Shared fixtures of the TOFU harness tests: a tiny random Llama adapter and one evaluation of it."""

import pytest

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.eval import evaluate_tofu
from tests.tiny import tiny_causal_lm, tiny_tokenizer

SOURCE = "synthetic:n_authors=10"  # forget10_perturbed / holdout10 / retain_perturbed: 20 items each
SIZES = {"forget": 20, "retain": 20, "ra": 34, "wf": 38, "holdout": 20}
MAX_NEW_TOKENS = 4


@pytest.fixture(scope="session")
def adapter():
    return TextLLMAdapter(tiny_causal_lm(seed=0), tiny_tokenizer())


@pytest.fixture(scope="session")
def evaluated(adapter, tmp_path_factory):
    """(logs, out_dir) of one full evaluation, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("tofu_eval")
    logs = evaluate_tofu(
        adapter, SOURCE, forget_split="forget10", out_dir=out, batch_size=8, max_new_tokens=MAX_NEW_TOKENS
    )
    return logs, out
