"""Scoring pass: agrees with the adapter and with a direct computation, batch-size invariant, log-prob safe."""

import numpy as np
import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.eval import score_answers, score_candidates
from tests.eval.conftest import SOURCE


@pytest.fixture(scope="module")
def items():
    return load_split(SOURCE, "forget10_perturbed")[:7]


def test_avg_nll_equals_adapter_answer_nll(adapter, items):
    s = score_answers(adapter, items, batch_size=3)
    ref = adapter.answer_nll(items, batch_size=7).numpy()
    np.testing.assert_allclose(s.avg_nll, ref, rtol=1e-6, atol=1e-6)
    paras = [it.paraphrased_answer for it in items]
    np.testing.assert_allclose(
        score_answers(adapter, items, paras).avg_nll,
        adapter.answer_nll(items, answers=paras).numpy(),
        rtol=1e-6,
        atol=1e-6,
    )
    assert not np.allclose(score_answers(adapter, items, paras).avg_nll, s.avg_nll)


def test_scores_do_not_depend_on_batch_size(adapter, items):
    runs = [score_answers(adapter, items, batch_size=b, token_stats=True) for b in (1, 3, 16)]
    for other in runs[1:]:
        np.testing.assert_allclose(other.avg_nll, runs[0].avg_nll, atol=1e-5)
        for field in ("token_logprobs", "mu", "sigma"):
            for a, b in zip(getattr(runs[0], field), getattr(other, field)):
                np.testing.assert_allclose(a, b, atol=1e-4)
        for a, b in zip(runs[0].matches, other.matches):
            np.testing.assert_array_equal(a, b)
        assert other.target_text == runs[0].target_text


def test_token_stats_match_a_direct_computation(adapter, items):
    item = items[2]
    s = score_answers(adapter, [items[0], item, items[1]], batch_size=3, token_stats=True)
    # Direct: one forward of this item alone; answer positions without the trailing EOS.
    ans_ids = adapter.tokenizer(" " + item.answer, add_special_tokens=False)["input_ids"]
    prompt_ids, _ = adapter.encode(item.question)
    ids = torch.tensor([prompt_ids + ans_ids + [adapter.eos_id]])
    with torch.no_grad():
        logits = adapter.model(input_ids=ids).logits[0].double()
    lp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(ans_ids)]
    target = torch.tensor(ans_ids)
    p = lp.exp()
    mu = (p * lp).sum(-1)
    sigma = ((p * lp * lp).sum(-1) - mu**2).clamp_min(1e-6).sqrt()
    tok = lp.gather(-1, target[:, None]).squeeze(-1)
    assert len(s.token_logprobs[1]) == len(ans_ids)  # EOS excluded, as in the reference
    np.testing.assert_allclose(s.token_logprobs[1], tok.numpy(), atol=1e-5)
    np.testing.assert_allclose(s.mu[1], mu.numpy(), atol=1e-5)
    np.testing.assert_allclose(s.sigma[1], sigma.numpy(), atol=1e-5)
    np.testing.assert_array_equal(s.matches[1], (lp.argmax(-1) == target).numpy())
    assert s.target_text[1] == adapter.tokenizer.decode(ans_ids + [adapter.eos_id], skip_special_tokens=True)
    # avg NLL covers the EOS too (the reference's evaluate_probability)
    full = (
        torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
        .gather(-1, torch.tensor(ans_ids + [adapter.eos_id])[:, None])
        .squeeze(-1)
    )
    assert s.avg_nll[1] == pytest.approx(-full.mean().item(), abs=1e-5)


def test_candidates_are_scored_per_item_in_order(adapter, items):
    cands = [it.perturbed_answer for it in items]
    nll = score_candidates(adapter, items, cands, batch_size=4)
    assert nll.shape == (7, 5)
    for k in (0, 4):
        direct = adapter.answer_nll(items, answers=[c[k] for c in cands]).numpy()
        np.testing.assert_allclose(nll[:, k], direct, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="same non-zero number of candidates"):
        score_candidates(adapter, items[:2], [cands[0], cands[1][:3]])


class LogProbAdapter(TextLLMAdapter):
    """A model whose forward returns normalised log-probs (as a tilted model does)."""

    def logits(self, batch):
        logits, targets = super().logits(batch)
        return torch.log_softmax(logits, -1), targets


def test_log_prob_outputs_score_the_same(adapter, items):
    tilted = LogProbAdapter(adapter.model, adapter.tokenizer)
    a = score_answers(adapter, items, token_stats=True)
    b = score_answers(tilted, items, token_stats=True)
    np.testing.assert_allclose(a.avg_nll, b.avg_nll, atol=1e-5)
    for x, y in zip(a.mu + a.sigma, b.mu + b.sigma):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_bad_inputs_raise(adapter, items):
    with pytest.raises(ValueError, match="no items"):
        score_answers(adapter, [])
    with pytest.raises(ValueError, match="2 answers for 7 items"):
        score_answers(adapter, items, ["a", "b"])
    with pytest.raises(ValueError, match="batch_size"):
        score_answers(adapter, items, batch_size=0)
