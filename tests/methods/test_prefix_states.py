"""The rule's scoring made cheaper without changing a score: the blocks below an edit computed once per batch, and
an erasure's bases computed once per rank across the sweep's scales."""

import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.erase import erase, restore
from mmunlearn.methods.prefix_states import PrefixReuse, PrefixStates
from tests.tiny import block_task_matrices, tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"


def _adapter():
    return TextLLMAdapter(tiny_causal_lm(layers=4), tiny_tokenizer())


def _upper(model, blocks=(2, 3)):
    tm = block_task_matrices(model, hot=3, scale=0.2)
    return {n: t for n, t in tm.items() if any(f".layers.{b}." in n for b in blocks)}


def test_scores_are_unchanged_and_the_lower_blocks_run_once_per_batch():
    ad = _adapter()
    rows = load_split(SRC, "forget10")[:12]
    blocks = list(ad.decoder_layers())
    reuse = PrefixReuse(ad)
    for scale in (1.0, 3.0):  # two sweep points: the second reuses the first one's states
        rep = erase(ad.model, _upper(ad.model), localize=False, rank=4, scale=scale)
        want = ad.answer_nll(rows, batch_size=4)
        assert reuse.first_block(rep) == 2
        with reuse.during(rep) as prefix:
            assert isinstance(prefix, PrefixStates) and not ad.model.config.use_cache
            got = ad.answer_nll(rows, batch_size=4)
            assert [type(b) for b in ad.decoder_layers()][2:] == [type(b) for b in blocks][2:]
        assert torch.equal(got, want)  # the very same scores
        restore(ad.model, rep)
    # 3 batches, each 2 forwards (the rows' shared prompt prefix into a KV cache, then the packed rows): computed at
    # the first point, taken at the second
    assert reuse.misses == 6 and reuse.hits == 6
    assert list(ad.decoder_layers()) == blocks and ad.model.config.use_cache  # all put back


def test_an_edit_of_the_first_block_or_outside_the_blocks_reuses_nothing():
    ad = _adapter()
    reuse = PrefixReuse(ad)
    rep = erase(ad.model, _upper(ad.model, blocks=(0, 3)), localize=False, rank=4)
    assert reuse.first_block(rep) == 0
    with reuse.during(rep) as prefix:
        assert prefix is None
    restore(ad.model, rep)
    head = {"lm_head.weight": 0.01 * torch.randn_like(ad.model.lm_head.weight)}
    rep = erase(ad.model, head, localize=False, rank=2)
    assert reuse.first_block(rep) == 0


def test_a_generation_through_the_stand_in_fills_its_kv_cache_as_the_blocks_would():
    ad = _adapter()
    prompt = ad.tokenizer("an author", return_tensors="pt")["input_ids"]
    want = ad.model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    rep = erase(ad.model, _upper(ad.model), localize=False, rank=4, scale=0.0)  # an edit of size 0
    reuse = PrefixReuse(ad)
    with reuse.during(rep) as prefix:
        got = ad.model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        misses = prefix.misses
        got_again = ad.model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want) and torch.equal(got_again, want)
    # the second generation took every step from the stand-in, each step reading the cache it had refilled
    assert prefix.misses == misses and prefix.hits == misses


def test_bases_kept_across_scales_give_the_same_edit():
    model = tiny_causal_lm(layers=2)
    tf = block_task_matrices(model, hot=1, seed=0)
    tr = block_task_matrices(model, hot=0, seed=1)
    fresh = erase(model, tf, tr, rank=3, retain_rank=4, scale=2.5)
    edited = {n: p.detach().clone() for n, p in model.named_parameters()}
    restore(model, fresh)
    factors: dict = {}
    for scale in (1.0, 2.5):  # the second call takes every basis from the first
        rep = erase(model, tf, tr, rank=3, retain_rank=4, scale=scale, factors=factors)
        if scale != 2.5:
            restore(model, rep)
    assert len(factors) == sum(1 for row in fresh.layers for _ in row.matrices)
    assert all(torch.equal(p.detach(), edited[n]) for n, p in model.named_parameters())
    assert [m.norm_removed for r in rep.layers for m in r.matrices] == [
        m.norm_removed for r in fresh.layers for m in r.matrices
    ]
