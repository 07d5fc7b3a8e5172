"""TiltedCausalLM: generate scores equal teacher-forced tilted log-probs; limits T=1/zero head and no tilt."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.tilt import TiltedCausalLM, TiltHead
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def random_head(model, rank=4, seed=0):
    torch.manual_seed(seed)
    head = TiltHead(model.config.hidden_size, model.config.vocab_size, rank)
    with torch.no_grad():
        head.B.weight.normal_(0, 2.0)
        head.B.bias.normal_(0, 1.0)
    return head


def prompts(tok, questions):
    ad = TextLLMAdapter(tiny_causal_lm(), tok)
    return ad.prompt_batch(questions)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("sample", [False, True])
def test_generate_scores_equal_teacher_forced_tilted_logprobs(arch, sample):
    base = tiny_causal_lm(arch)
    tilted = TiltedCausalLM(base, random_head(base), temperature=1.5)
    tok = tiny_tokenizer()
    batch = prompts(tok, ["Where was the author born?", "What genre?"])
    torch.manual_seed(1)
    out = tilted.generate(
        **batch,
        max_new_tokens=6,
        do_sample=sample,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=None,
    )
    seq = out.sequences
    start = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones(seq.shape[0], seq.shape[1] - start, dtype=torch.long)], 1)
    with torch.no_grad():
        forced = tilted(input_ids=seq, attention_mask=mask).logits
    for t, step_scores in enumerate(out.scores):
        assert torch.allclose(step_scores, forced[:, start - 1 + t], atol=1e-5)
        # and the emitted token is consistent with the scores (greedy: argmax)
        if not sample:
            assert torch.equal(step_scores.argmax(-1), seq[:, start + t])


def test_t1_zero_head_equals_base():
    base = tiny_causal_lm()
    tilted = TiltedCausalLM(base, TiltHead(base.config.hidden_size, base.config.vocab_size, 4), temperature=1.0)
    ids = torch.randint(3, 500, (2, 9))
    with torch.no_grad():
        assert torch.allclose(
            tilted(input_ids=ids).logits, torch.log_softmax(base(input_ids=ids).logits, -1), atol=1e-6
        )
    batch = prompts(tiny_tokenizer(), ["What genre?"])
    a = base.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=0)
    b = tilted.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)


def test_no_tilt_equals_tempered_distribution():
    base = tiny_causal_lm()
    T = 2.0
    tilted = TiltedCausalLM(base, None, temperature=T)
    ids = torch.randint(3, 500, (2, 7))
    with torch.no_grad():
        want = torch.log_softmax(base(input_ids=ids).logits / T, -1)
        assert torch.allclose(tilted(input_ids=ids).logits, want, atol=1e-5)


def test_sampling_frequencies_follow_the_tilted_distribution():
    base = tiny_causal_lm()
    tilted = TiltedCausalLM(base, random_head(base, seed=3), temperature=1.3)
    batch = prompts(tiny_tokenizer(), ["What genre?"])
    n = 4000
    ids = batch["input_ids"].repeat(n, 1)
    torch.manual_seed(0)
    out = tilted.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=True, pad_token_id=0
    )
    with torch.no_grad():
        p = tilted(input_ids=batch["input_ids"]).logits[0, -1].exp()
    counts = torch.bincount(out[:, -1], minlength=p.numel()).float() / n
    top = p.topk(3).indices
    assert torch.allclose(counts[top], p[top], atol=0.03)


def test_warping_and_bad_temperature_rejected():
    base = tiny_causal_lm()
    with pytest.raises(ValueError, match="T >= 1"):
        TiltedCausalLM(base, None, temperature=0.5)
    tilted = TiltedCausalLM(base, None, temperature=1.0)
    with pytest.raises(ValueError, match="top_k"):
        tilted.generate(input_ids=torch.tensor([[1, 5, 6]]), max_new_tokens=2, top_k=5)


def test_save_load_keeps_head_and_settings(tmp_path):
    base = tiny_causal_lm()
    tilted = TiltedCausalLM(base, random_head(base), temperature=1.7, base_path="somewhere")
    tilted.save(tmp_path / "t3")
    again = TiltedCausalLM.load(tmp_path / "t3", base=base)
    ids = torch.randint(3, 500, (1, 8))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, tilted(input_ids=ids).logits)
    assert again.temperature == 1.7 and again.base_path == "somewhere"
    assert sorted(p.name for p in (tmp_path / "t3").iterdir()) == [
        ".mmunlearn-output",
        "tilt_config.json",
        "tilt_head.safetensors",
    ]


def test_adapter_scores_and_generates_through_the_tilted_model():
    base = tiny_causal_lm()
    tok = tiny_tokenizer()
    tilted = TiltedCausalLM(base, random_head(base), temperature=1.2)
    ad = TextLLMAdapter(tilted, tok)
    qa = [{"question": "What genre?", "answer": "Fantasy."}]
    nll = ad.answer_nll(qa)
    lp, mask = ad.logprobs(ad.collate(qa))
    assert torch.allclose(nll, -(lp.sum(1) / mask.sum(1)).double(), atol=1e-6)
    assert isinstance(ad.generate(["What genre?"], max_new_tokens=4)[0], str)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_cummean_head_generates_what_it_scores_teacher_forced(use_cache):
    """The running mean kept while generating (left-padded prompts, with or without a KV cache) equals the
    teacher-forced cumulative mean, so generate scores equal the tilted model's forward."""
    from mmunlearn.tilt.head import pool_states

    base = tiny_causal_lm("llama")
    head = random_head(base)
    head.pooling = "cummean"
    tilted = TiltedCausalLM(base, head, temperature=2.5)
    tok = tiny_tokenizer()
    batch = prompts(tok, ["Where was the author born?", "What genre?"])
    assert (batch["attention_mask"] == 0).any()  # one prompt is padded: padding must stay out of the mean
    out = tilted.generate(
        **batch,
        max_new_tokens=5,
        do_sample=False,
        output_scores=True,
        use_cache=use_cache,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=None,
    )
    seq, start = out.sequences, batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones(seq.shape[0], seq.shape[1] - start, dtype=torch.long)], 1)
    with torch.no_grad():
        forced = tilted(input_ids=seq, attention_mask=mask).logits
        last = TiltedCausalLM(base, random_head(base), temperature=2.5)(input_ids=seq, attention_mask=mask).logits
    for t, step_scores in enumerate(out.scores):
        assert torch.allclose(step_scores, forced[:, start - 1 + t], atol=1e-5)
    assert not torch.allclose(forced, last, atol=1e-3)  # the pooling changes what the head says
    states = torch.randn(1, 4, 3)
    pooled = pool_states(states, torch.tensor([[0, 1, 1, 1]]), "cummean")
    assert torch.allclose(pooled[0, 2], states[0, 1:3].mean(0)) and torch.equal(pooled[0, 0], torch.zeros(3))


def test_a_cummean_head_saves_its_pooling(tmp_path):
    base = tiny_causal_lm()
    head = random_head(base)
    head.pooling = "cummean"
    TiltedCausalLM(base, head, temperature=2.5).save(tmp_path / "port")
    again = TiltedCausalLM.load(tmp_path / "port", base=base)
    assert again.head.pooling == "cummean" and again.temperature == 2.5


def test_a_tilt_config_with_settings_of_its_own_is_refused(tmp_path):
    import json

    base = tiny_causal_lm()
    TiltedCausalLM(base, random_head(base), temperature=1.5).save(tmp_path / "t3")
    cfg = json.loads((tmp_path / "t3" / "tilt_config.json").read_text())
    for bad in ({**cfg, "trust_remote_code": True}, {**cfg, "temperature": "hot"}):
        (tmp_path / "t3" / "tilt_config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="unknown setting|must be a number"):
            TiltedCausalLM.load(tmp_path / "t3", base=base)


@pytest.mark.parametrize("pooling", ["last", "cummean"])
def test_a_tilt_sparing_seen_tokens_generates_what_it_scores_and_floors_only_those_tokens(pooling):
    """spare_seen: generate's scores equal the teacher-forced ones (left-padded prompts); every position scores
    log_softmax(logits / T + log f), the log f of a token already in the row floored at log 1/2 (a token the head
    never saw), every other token's as the plain tilt's; padding is never seen."""
    import math

    from mmunlearn.tilt.head import UNSEEN_LOG_F, pool_states
    from mmunlearn.tilt.processor import seen_tokens

    base = tiny_causal_lm("llama")
    head = random_head(base)
    head.pooling = pooling
    spared = TiltedCausalLM(base, head, temperature=1.5, spare_seen=True)
    plain = TiltedCausalLM(base, head, temperature=1.5)
    tok = tiny_tokenizer()
    batch = prompts(tok, ["Where was the author born?", "What genre?"])
    out = spared.generate(
        **batch, max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    seq, start = out.sequences, batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones(seq.shape[0], seq.shape[1] - start, dtype=torch.long)], 1)
    with torch.no_grad():
        forced = spared(input_ids=seq, attention_mask=mask).logits
        log_f = head.log_f(pool_states(spared.tap.states, mask, pooling)).float()
        tilted = plain(input_ids=seq, attention_mask=mask).logits
        tempered = base(input_ids=seq, attention_mask=mask).logits.float() / 1.5
    for t, step_scores in enumerate(out.scores):
        assert torch.allclose(step_scores, forced[:, start - 1 + t], atol=1e-5)
    seen = seen_tokens(seq, mask, forced.shape[-1])
    expected = torch.log_softmax(tempered + torch.where(seen, log_f.clamp(min=UNSEEN_LOG_F), log_f), -1)
    real = mask.bool()
    assert torch.allclose(forced[real], expected[real], atol=1e-4)
    assert UNSEEN_LOG_F == pytest.approx(math.log(0.5))
    # the floor is what changed the scores: some seen token was below it, and there spared and plain tilts differ
    below = seen & (log_f < UNSEEN_LOG_F)
    assert bool(below[real].any()) and not torch.allclose(forced[real], tilted[real], atol=1e-3)
    row, pos = 1, seq.shape[1] - 1
    tokens = seq[row][mask[row].bool()]
    assert bool(seen[row, pos, tokens].all()) and int(seen[row, pos].sum()) == len(set(tokens.tolist()))
    padded = int((mask[row] == 0).sum())
    assert padded > 0 and not bool(seen[row, padded - 1].any())  # a pad position: nothing seen yet


def test_a_tilt_sparing_seen_tokens_saves_the_setting_and_refuses_a_bad_one(tmp_path):
    import json

    base = tiny_causal_lm()
    TiltedCausalLM(base, random_head(base), temperature=1.5, spare_seen=True).save(tmp_path / "t3")
    assert TiltedCausalLM.load(tmp_path / "t3", base=base).spare_seen is True
    TiltedCausalLM(base, random_head(base), temperature=1.5).save(tmp_path / "old")
    assert "spare_seen" not in json.loads((tmp_path / "old" / "tilt_config.json").read_text())
    assert TiltedCausalLM.load(tmp_path / "old", base=base).spare_seen is False
    cfg = json.loads((tmp_path / "t3" / "tilt_config.json").read_text())
    (tmp_path / "t3" / "tilt_config.json").write_text(json.dumps({**cfg, "spare_seen": "yes"}))
    with pytest.raises(ValueError, match="spare_seen must be true or false"):
        TiltedCausalLM.load(tmp_path / "t3", base=base)
