"""T3 head training: the cache is reused, the head separates retain from forget, tilting lowers forget likelihood."""

import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.tilt import TiltedCausalLM
from mmunlearn.tilt.cache import build_cache
from mmunlearn.tilt.train import balanced_accuracy, train_tilt
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def test_balanced_accuracy_hand_values():
    labels = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert abs(balanced_accuracy(torch.tensor([1.0, 1.0, -1.0, -1.0]), labels) - (2 / 3 + 1) / 2) < 1e-6


def test_head_separates_partitions_and_tilts_forget_down(tmp_path):
    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:20], load_split(src, "retain90")[:40]
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    res = train_tilt(ad, retain, forget, rank=8, epochs=60, lr=2e-2, cache_dir=tmp_path, progress=False)
    assert res.train_accuracy > 0.75  # chance is 0.5
    assert res.parameters == 32 * 8 + 8 * 512 + 512 and 0 < res.fraction < 1
    assert res.cache_seconds > 0 and not res.cache_reused
    again = build_cache(ad, retain, forget, cache_dir=tmp_path)
    assert again.reused and again.seconds == 0.0
    base_f, base_r = ad.answer_nll(forget).mean(), ad.answer_nll(retain).mean()
    tilted = TextLLMAdapter(TiltedCausalLM(ad.model, res.head, temperature=1.0), ad.tokenizer)
    rise_f = tilted.answer_nll(forget).mean() - base_f
    rise_r = tilted.answer_nll(retain).mean() - base_r
    assert rise_f > 0 and rise_f > rise_r
    # a token no training answer holds: its bias stays 0 and its row at the small init, so the head gives it about
    # even odds, log f near log 1/2 (the floor spare_seen uses), where the trained tokens spread far from it
    from mmunlearn.tilt.head import UNSEEN_LOG_F

    used = sorted({int(t) for t in again.tokens})
    unused = [v for v in range(res.head.B.out_features) if v not in set(used)]
    assert unused and bool((res.head.B.bias[unused] == 0).all())
    with torch.no_grad():
        log_f = res.head.log_f(again.states)
    off_unused = float((log_f[:, unused] - UNSEEN_LOG_F).abs().mean())
    off_used = float((log_f[:, used] - UNSEEN_LOG_F).abs().mean())
    assert off_unused < 0.25 and off_used > 4 * off_unused  # measured: 0.09 and 2.75
