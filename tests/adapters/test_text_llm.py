"""Text LLM adapter on tiny Llama, Qwen2 and GPT-2 models with a trained byte-level BPE."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import IGNORE, TextLLMAdapter
from tests.tiny import tiny_causal_lm, tiny_tokenizer

ARCHS = ["llama", "qwen2", "gpt2"]
QA = [
    {"question": "Where was the author born?", "answer": "In a small town by the sea."},
    {"question": "What genre?", "answer": "Fantasy."},
    {
        "question": "Which award did the writer of many long novels receive?",
        "answer": "The Golden Quill Award for fiction.",
    },
]


@pytest.fixture(params=ARCHS)
def adapter(request):
    return TextLLMAdapter(tiny_causal_lm(request.param), tiny_tokenizer())


def test_labels_cover_exactly_the_answer_and_eos(adapter):
    batch = adapter.collate(QA)
    tok = adapter.tokenizer
    for i, ex in enumerate(QA):
        lab = batch["labels"][i]
        ids = lab[lab != IGNORE].tolist()
        assert ids[-1] == tok.eos_token_id
        assert tok.decode(ids[:-1]) == " " + ex["answer"]
        # the prompt is fully masked and padding is masked too
        assert (batch["labels"][i][batch["attention_mask"][i] == 0] == IGNORE).all()


def test_loss_is_mean_of_teacher_forced_token_nll(adapter):
    batch = adapter.collate(QA)
    lp, mask = adapter.logprobs(batch)
    assert torch.allclose(adapter.loss(batch), -lp.sum() / mask.sum(), atol=1e-5)


def test_answer_nll_does_not_depend_on_batching(adapter):
    together = adapter.answer_nll(QA, batch_size=3)
    alone = torch.cat([adapter.answer_nll([ex], batch_size=1) for ex in QA])
    assert torch.allclose(together, alone, atol=1e-5)
    other = adapter.answer_nll(QA, answers=["Fantasy."] * 3)
    assert not torch.allclose(other, together)


def test_batched_greedy_generation_equals_one_by_one(adapter):
    questions = [ex["question"] for ex in QA]
    batched = adapter.generate(questions, max_new_tokens=6, batch_size=3)
    single = [adapter.generate([q], max_new_tokens=6)[0] for q in questions]
    assert batched == single and all(isinstance(t, str) for t in batched)


def test_greedy_generation_follows_teacher_forced_argmax(adapter):
    q = QA[0]["question"]
    text = adapter.generate([q], max_new_tokens=5)[0]
    ids = adapter.encode(q)[0]
    for _ in range(5):
        logits = adapter.model(input_ids=torch.tensor([ids])).logits[0, -1]
        nxt = int(logits.argmax())
        if nxt == adapter.eos_id:
            break
        ids.append(nxt)
    manual = adapter.tokenizer.decode(ids[len(adapter.encode(q)[0]) :], skip_special_tokens=True).strip()
    assert text == manual


@pytest.mark.parametrize("arch, per_block", [("llama", 7), ("qwen2", 7), ("gpt2", 4)])
def test_layers_are_block_linears_only(arch, per_block):
    ad = TextLLMAdapter(tiny_causal_lm(arch, layers=3), tiny_tokenizer())
    layers = list(ad.layers())
    assert len(layers) == 3 * per_block
    assert {lw.block for lw in layers} == {
        lw.name.split(".", 1)[0] + "." + lw.name.split(".")[1] + "." + str(i) for lw in layers[:1] for i in range(3)
    }
    assert all(lw.weight.dim() == 2 and "embed" not in lw.name and "wte" not in lw.name for lw in layers)
    extra = list(ad.layers(include_embeddings=True, include_lm_head=True))
    assert len(extra) > len(layers)


def test_hidden_states_final_and_indexed(adapter):
    batch = adapter.collate(QA[:2])
    h = adapter.hidden_states(batch)
    assert h.shape[:2] == batch["input_ids"].shape and h.shape[2] == 32
    assert adapter.hidden_states(batch, 0).shape == h.shape
    with pytest.raises(ValueError, match="layer must be"):
        adapter.hidden_states(batch, 99)


def test_save_load_roundtrip(adapter, tmp_path):
    batch = adapter.collate(QA)
    before = adapter.logprobs(batch)[0]
    adapter.save(tmp_path / "m")
    again = TextLLMAdapter.from_pretrained(tmp_path / "m", device="cpu")
    assert torch.allclose(again.logprobs(batch)[0], before, atol=1e-6)
    with pytest.raises(FileExistsError):
        adapter.save(tmp_path / "m")


def test_chat_template_is_used_when_present():
    tok = tiny_tokenizer()
    tok2 = type(tok)(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok2.chat_template = "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    ad = TextLLMAdapter(tiny_causal_lm(), tok2)
    assert ad.use_chat_template and ad.prompt_text("Hi?") == "<s>[user] Hi?\n[assistant]"
    lab = ad.collate([{"question": "Hi?", "answer": "Hello."}])["labels"][0]
    assert tok2.decode(lab[lab != IGNORE][:-1]) == "Hello."


def test_bad_inputs():
    ad = TextLLMAdapter(tiny_causal_lm(), tiny_tokenizer())
    with pytest.raises(ValueError, match="empty"):
        ad.collate([])
    with pytest.raises(ValueError, match="question"):
        ad.collate([{"answer": "x"}])
    with pytest.raises(FileNotFoundError):
        TextLLMAdapter.from_pretrained("/nonexistent/model/dir")


def test_kv_cache_generation_equals_recomputing_every_step(adapter):
    questions = [ex["question"] for ex in QA]
    cached = adapter.generate(questions, max_new_tokens=6, batch_size=3, use_cache=True)
    recomputed = adapter.generate(questions, max_new_tokens=6, batch_size=3, use_cache=False)
    assert cached == recomputed
