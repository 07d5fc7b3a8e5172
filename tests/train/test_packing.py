"""Packed rows and the shared prefix give the plain forward's per-row losses, scores and gradients."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.train import packing
from mmunlearn.train.answer_only import answer_logits
from tests.tiny import tiny_causal_lm, tiny_tokenizer

PREFIX = [1, 5, 6, 7, 8, 9]  # every row starts with these (like a chat template's system prompt)


def _batch(seed: int = 0, lengths=(20, 10, 14, 10, 12)):
    """Right-padded rows sharing PREFIX, answers (labels) on each row's last few tokens."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        row = PREFIX + torch.randint(3, 500, (n - len(PREFIX),), generator=g).tolist()
        ids[r, :n] = torch.tensor(row)
        mask[r, :n] = 1
        labels[r, n - 3 : n] = ids[r, n - 3 : n]
    return ids, mask, labels


def _row_losses(model, ids, mask, labels):
    logits, targets, rows = answer_logits(model, ids, mask, labels)
    nll = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
    return torch.stack([nll[rows == r].mean() for r in range(ids.shape[0])])


def _plain_row_losses(model, ids, mask, labels):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    tgt = labels[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt.clamp(min=0), reduction="none")
    scored = tgt != -100
    return (nll * scored).sum(1) / scored.sum(1)


def test_the_plan_packs_rows_and_finds_the_shared_prefix():
    model = tiny_causal_lm("llama")
    ids, mask, labels = _batch()
    layout = packing.plan(model, ids, mask, labels)
    assert layout is not None
    assert layout.prefix.tolist() == [PREFIX]
    rest = [n - len(PREFIX) for n in (20, 10, 14, 10, 12)]
    assert layout.input_ids.shape[1] == max(rest)  # bins as wide as the longest row's rest
    assert layout.input_ids.shape[0] < len(rest)  # fewer sequences than rows: packed
    assert layout.real_slots == sum(rest)  # every real token once, padding only to fill the last bins
    mask4 = layout.mask(torch.float32, additive=False)
    seg = layout.segments
    for s in range(seg.shape[0]):
        for q in range(seg.shape[1]):
            for k in range(seg.shape[1]):  # a real token never sees another row's tokens
                if seg[s, q] >= 0 and seg[s, k] >= 0 and seg[s, q] != seg[s, k]:
                    assert not mask4[s, 0, q, len(PREFIX) + k]


@pytest.mark.parametrize("arch,attn", [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa")])
@pytest.mark.parametrize("pack,prefix", [(True, True), (True, False), (False, True)])
def test_packed_rows_give_the_same_per_row_losses_and_gradients(arch, attn, pack, prefix):
    ids, mask, labels = _batch(1)
    a, b = tiny_causal_lm(arch, seed=2), tiny_causal_lm(arch, seed=2)
    for m in (a, b):
        m.config._attn_implementation = attn
    with packing.settings(pack=pack, prefix=prefix):
        layout = packing.plan(a, ids, mask, labels)
        assert layout is not None and (layout.prefix.shape[1] > 0) == prefix
        ours = _row_losses(a, ids, mask, labels)
    theirs = _plain_row_losses(b, ids, mask, labels)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    ours.mean().backward()
    theirs.mean().backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_switched_off_or_unsupported_it_takes_the_plain_forward():
    ids, mask, labels = _batch(2)
    with packing.settings(pack=False, prefix=False):
        assert packing.plan(tiny_causal_lm("llama"), ids, mask, labels) is None
    assert packing.plan(tiny_causal_lm("gpt2"), ids, mask, labels) is None  # not a known model type
    left = torch.flip(mask, [1])  # left padding: the layout assumes right-padded rows
    assert packing.plan(tiny_causal_lm("llama"), ids, left, labels) is None


def test_adapter_scores_with_and_without_the_fast_path_agree():
    tok = tiny_tokenizer()
    model = tiny_causal_lm("llama", vocab=len(tok))
    adapter = TextLLMAdapter(model, tok)
    items = load_split("synthetic", "forget10")[:6]
    batch = adapter.collate(items)
    assert packing.plan(model, batch["input_ids"], batch["attention_mask"], batch["labels"]) is not None
    fast = adapter.answer_nll(items, batch_size=6)
    with packing.settings(pack=False, prefix=False):
        slow = adapter.answer_nll(items, batch_size=6)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_gradient_checkpointing_packs_without_the_prefix_cache():
    ids, mask, labels = _batch(3)
    a, b = tiny_causal_lm("llama", seed=4), tiny_causal_lm("llama", seed=4)
    (getattr(a, "activation_checkpointing_enable", None) or a.gradient_checkpointing_enable)()  # renamed in 5.x
    a.train()
    layout = packing.plan(a, ids, mask, labels)
    assert layout is not None and layout.prefix.shape[1] == 0  # the cache is off under checkpointing
    torch.testing.assert_close(
        _row_losses(a, ids, mask, labels), _plain_row_losses(b, ids, mask, labels), rtol=1e-5, atol=1e-5
    )
