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


def test_earlier_marks_copies_of_real_tokens_before_the_position():
    from mmunlearn.tilt.cache import earlier

    ids = torch.tensor([[5, 7, 5, 9, 7], [0, 0, 5, 5, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    assert earlier(ids, mask).tolist() == [[False, True, False, True], [False, False, True, False]]
    # without a mask the padding counts as text: the second pad copies the first
    assert earlier(ids, None)[1].tolist() == [True, False, True, False]


def test_earlier_agrees_with_what_scoring_spares():
    from mmunlearn.tilt.cache import earlier
    from mmunlearn.tilt.processor import seen_tokens

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    seen = seen_tokens(ids, mask, 6)  # B x L x V: what TiltedCausalLM spares at each position
    expected = seen[:, :-1].gather(2, ids[:, 1:, None]).squeeze(-1)
    assert torch.equal(earlier(ids, mask), expected)
    assert expected.any() and not expected.all()


def _toy_cache(seen_token: int = 3):
    from mmunlearn.tilt.cache import StateCache

    g = torch.Generator().manual_seed(1)
    n = 40
    tokens = torch.randint(0, 3, (n,), generator=g)
    tokens[::5] = seen_token  # this token only ever occurs as a copy of the text before it
    labels = (torch.arange(n) % 2).float()
    seen = tokens == seen_token
    return StateCache(torch.randn(n, 6, generator=g), tokens, labels, torch.arange(n), seen, None, 0.0, False)


def test_fit_unseen_leaves_the_copied_tokens_out_of_training():
    from mmunlearn.tilt.train import fit_head, training_positions

    cache = _toy_cache()
    assert training_positions(cache, True).tolist() == [i for i in range(40) if i % 5]
    only, _ = fit_head(cache, vocab=5, rank=2, epochs=20, lr=5e-2, progress=False, unseen_only=True)
    every, _ = fit_head(cache, vocab=5, rank=2, epochs=20, lr=5e-2, progress=False)
    only, every = only.B.bias.detach(), every.B.bias.detach()
    # token 3 is trained only when its (seen) positions are kept; token 4 never occurs: untouched either way
    assert float(only[3]) == 0.0 and float(every[3]) != 0.0
    assert float(only[4]) == 0.0 and float(every[4]) == 0.0
    assert bool((only[:3] != 0).all())


def test_cache_keeps_seen_marks_and_an_old_cache_is_extracted_again(tmp_path):
    from safetensors.torch import load_file, save_file

    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:4], load_split(src, "retain90")[:4]
    ad = TextLLMAdapter(tiny_causal_lm(layers=1), tiny_tokenizer())
    first = build_cache(ad, retain, forget, cache_dir=tmp_path)
    assert first.seen.dtype == torch.bool and len(first.seen) == len(first.tokens) and first.seen.any()
    again = build_cache(ad, retain, forget, cache_dir=tmp_path)
    assert again.reused and torch.equal(again.seen, first.seen)
    old = {k: v for k, v in load_file(str(first.path)).items() if k != "seen"}  # as written before the marks
    save_file(old, str(first.path))
    redone = build_cache(ad, retain, forget, cache_dir=tmp_path)
    assert not redone.reused and torch.equal(redone.seen, first.seen)
