"""Optimisation baselines: each loss matches its formula at the reference point,
and unlearning raises the forget NLL."""

import copy
import math

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.baselines import REGISTRY, BaselineConfig, unlearn
from mmunlearn.baselines.base import LossContext
from mmunlearn.data.tofu import load_split
from tests.tiny import tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def data():
    src = "synthetic:n_authors=10"
    return load_split(src, "forget10")[:8], load_split(src, "retain90")[:16]


@pytest.fixture
def adapter():
    return TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())


def test_registry_has_the_five_baselines():
    assert set(REGISTRY) == {"grad_ascent", "grad_diff", "kl", "npo", "simnpo"}


def test_losses_equal_their_formulas_at_the_reference_point(adapter, data):
    forget, retain = data
    fb, rb = adapter.collate(forget[:4]), adapter.collate(retain[:4])
    cfg = BaselineConfig(alpha=0.7, gamma=1.3, beta=0.2, delta=0.5)
    ctx = LossContext(adapter, copy.deepcopy(adapter.model), cfg)
    m = adapter.model
    with torch.no_grad():
        nll_f, nll_r = float(adapter.loss(fb)), float(adapter.loss(rb))
        avg = (-adapter.sequence_logprob(fb, average=True)).tolist()
        got = {name: float(spec.loss(ctx, m, fb, rb)) for name, spec in REGISTRY.items()}
    assert got["grad_ascent"] == pytest.approx(-nll_f, rel=1e-5)
    assert got["grad_diff"] == pytest.approx(-1.3 * nll_f + 0.7 * nll_r, rel=1e-5)
    assert got["kl"] == pytest.approx(-1.3 * nll_f, rel=1e-5)  # KL to itself is 0
    assert got["npo"] == pytest.approx(1.3 * (2 / 0.2) * math.log(2) + 0.7 * nll_r, rel=1e-5)  # log-ratio 0
    simnpo = sum(-(2 / 0.2) * math.log(1 / (1 + math.exp(-0.2 * (a - 0.5)))) for a in avg) / len(avg)
    assert got["simnpo"] == pytest.approx(1.3 * simnpo + 0.7 * nll_r, rel=1e-5)


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_unlearning_raises_forget_nll(adapter, data, method):
    forget, retain = data
    before = adapter.answer_nll(forget).mean()
    res = unlearn(adapter, method, forget, retain, BaselineConfig(epochs=3, lr=5e-3, batch_size=4), progress=False)
    after = adapter.answer_nll(forget).mean()
    assert res.steps == 6 and after > before + 0.05


def test_bad_requests(adapter, data):
    forget, retain = data
    with pytest.raises(ValueError, match="unknown baseline"):
        unlearn(adapter, "gradient_surgery", forget, retain)
    with pytest.raises(ValueError, match="needs a non-empty retain"):
        unlearn(adapter, "grad_diff", forget, None)
    with pytest.raises(ValueError, match="forget set is empty"):
        unlearn(adapter, "grad_ascent", [], retain)
