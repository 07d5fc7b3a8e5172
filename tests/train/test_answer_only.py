"""Answer-only logits equal the full forward's at the scored positions; losses, scores and gradients agree."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.eval.scoring import score_answers
from mmunlearn.train.answer_only import answer_logits, supports_answer_only
from mmunlearn.train.loop import causal_lm_loss
from tests.tiny import tiny_causal_lm, tiny_llama, tiny_tokenizer


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (3, 9), generator=g)
    labels = torch.full_like(ids, -100)
    labels[0, 4:9] = ids[0, 4:9]
    labels[1, 2:5] = ids[1, 2:5]
    labels[2, 7:8] = ids[2, 7:8]
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask, labels


def test_answer_logits_equal_the_full_forward_at_scored_positions():
    model = tiny_llama()
    ids, mask, labels = _batch()
    logits, targets, rows = answer_logits(model, ids, mask, labels)
    full = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    scored = labels[:, 1:] != -100
    assert logits.shape == (int(scored.sum()), full.shape[-1])
    torch.testing.assert_close(logits, full[scored], rtol=1e-5, atol=1e-5)
    assert targets.tolist() == labels[:, 1:][scored].tolist()
    assert rows.tolist() == [0] * 5 + [1] * 3 + [2]


def test_causal_lm_loss_and_its_gradient_match_the_models_own_loss():
    ids, mask, labels = _batch(1)
    a, b = tiny_llama(seed=3), tiny_llama(seed=3)
    ours = causal_lm_loss(a, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    theirs = b(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    ours.backward()
    theirs.backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_wrapper_that_is_not_a_plain_hf_model_takes_the_full_path():
    model = tiny_llama()

    class Wrapper(torch.nn.Module):  # like T3's tilted model: its own forward, not a PreTrainedModel
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    wrapped = Wrapper(model)
    assert supports_answer_only(model) and not supports_answer_only(wrapped)
    ids, mask, labels = _batch(2)
    got, _, _ = answer_logits(wrapped, ids, mask, labels)
    want, _, _ = answer_logits(model, ids, mask, labels)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_shape_mismatch_is_a_clear_error():
    ids, mask, labels = _batch()
    with pytest.raises(ValueError, match="differ in shape"):
        answer_logits(tiny_llama(), ids, mask, labels[:, :-1])


@pytest.fixture(scope="module")
def adapter():
    return TextLLMAdapter(tiny_causal_lm(), tiny_tokenizer())


def test_adapter_scores_equal_the_full_logits_path(adapter):
    items = load_split("synthetic", "forget10")[:6]
    batch = adapter.collate(items)
    logits, targets = adapter.logits(batch)
    mask = targets != -100
    full_lp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    lp, got_mask = adapter.logprobs(batch)
    assert torch.equal(got_mask, mask)
    torch.testing.assert_close(lp, full_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adapter.loss(batch), -full_lp.sum() / mask.sum(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        adapter.target_distributions(batch), torch.log_softmax(logits[mask], -1), rtol=1e-5, atol=1e-5
    )


def test_bf16_precision_scores_within_a_small_tolerance_of_float32(adapter):
    items = load_split("synthetic", "forget10")[:8]
    fp32 = score_answers(adapter, items, batch_size=4).avg_nll
    bf16 = TextLLMAdapter(adapter.model, adapter.tokenizer, precision="bf16")
    got = score_answers(bf16, items, batch_size=4).avg_nll
    assert abs(got.mean() - fp32.mean()) < 0.05  # autocast is on: not bit-equal, but close
    assert not (got == fp32).all()
    with pytest.raises(ValueError, match="precision must be one of"):
        TextLLMAdapter(adapter.model, adapter.tokenizer, precision="fp8")


def test_bf16_generation_uses_a_bf16_copy_and_leaves_the_weights_alone(adapter):
    bf16 = TextLLMAdapter(adapter.model, adapter.tokenizer, precision="bf16")
    before = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    with bf16.bf16_generation():
        assert bf16._generation_model is not None
        assert next(bf16._generation_model.parameters()).dtype == torch.bfloat16
        texts = bf16.generate(["Who wrote the book?"], max_new_tokens=4)
    assert bf16._generation_model is None and len(texts) == 1
    assert all(torch.equal(before[k], v) for k, v in adapter.model.state_dict().items())
    assert next(adapter.model.parameters()).dtype == torch.float32
