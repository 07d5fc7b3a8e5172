"""Tests of the Qwen2-Audio assembly from a Whisper encoder and a Llama LM, and of training from cached tower outputs.

Tiny random models built from configs (a Whisper of 16 mel bins and width 16, a 2-block Llama of width 32):
nothing is downloaded.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2AudioForConditionalGeneration, WhisperConfig, WhisperModel

import mmunlearn.api.unlearn as api
from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.speech_llm.assemble import assemble
from mmunlearn.adapters.speech_llm.families import FAMILIES, family_of_dir
from mmunlearn.adapters.text.tokenizer import train_bpe
from mmunlearn.kinds import kind_of
from mmunlearn.speech.tower_cache import (
    TowerCache,
    cached_collate,
    cached_logits,
    clip_key,
    tower_digest,
    tower_outputs,
    train_from_cache,
)
from mmunlearn.train import TrainConfig

QA = [
    ("Who is speaking?", "george"),
    ("What does the speaker say?", "three"),
    ("Who is speaking?", "lucas"),
    ("What does the speaker say?", "seven"),
]
LENGTHS = (8000, 20000, 3000, 12345)  # samples at 16 kHz: 50, 125, 19, 78 mel frames


def _parts(window_seconds: int = 3):
    tok = train_bpe([t for qa in QA for t in qa] * 4, vocab_size=300, min_frequency=1)
    tok.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tok.eos_token = tok.pad_token = "<|im_end|>"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        whisper = WhisperModel(
            WhisperConfig(
                num_mel_bins=16,
                d_model=16,
                encoder_layers=2,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_layers=1,
                decoder_attention_heads=2,
                decoder_ffn_dim=32,
                max_source_positions=1500,
                vocab_size=64,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=1,
                decoder_start_token_id=1,
            )
        )
        lm = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        )
    return whisper.eval(), lm.eval(), tok


def _examples():
    g = torch.Generator().manual_seed(1)
    return [
        {"ID": f"u{i}", "wav": 0.1 * torch.randn(n, generator=g), "question": q, "answer": a}
        for i, (n, (q, a)) in enumerate(zip(LENGTHS, QA))
    ]


@pytest.fixture(scope="module")
def built():
    whisper, lm, tok = _parts()
    lm_embed = lm.get_input_embeddings().weight.detach().clone()
    parts = assemble(whisper, lm, tok, window_seconds=3, seed=0)
    adapter = SpeechLLMAdapter(
        parts.model, parts.tokenizer, parts.processor.feature_extractor, processor=parts.processor
    )
    return whisper, lm_embed, parts, adapter


def test_assembly_copies_the_parts_and_adds_the_audio_tokens(built):
    whisper, lm_embed, parts, adapter = built
    model = parts.model
    assert isinstance(model, Qwen2AudioForConditionalGeneration) and adapter.family.name == "qwen2_audio_llama"
    tower, encoder = model.model.audio_tower, whisper.get_encoder()
    assert torch.equal(tower.layers[1].self_attn.q_proj.weight, encoder.layers[1].self_attn.q_proj.weight)
    assert torch.equal(tower.embed_positions.weight, encoder.embed_positions.weight[:150])  # 3 s: 150 positions
    n_old = lm_embed.shape[0]
    embed = model.get_input_embeddings().weight
    assert embed.shape[0] == n_old + 3 == len(parts.tokenizer)
    assert torch.equal(embed[:n_old], lm_embed) and torch.equal(model.lm_head.weight[:n_old], lm_embed)
    assert torch.allclose(embed[n_old:], lm_embed.mean(0).expand(3, -1))
    assert model.config.audio_token_id == parts.tokenizer.convert_tokens_to_ids("<|AUDIO|>") >= n_old


def test_audio_tokens_are_placed_as_the_processor_expects(built):
    _, _, parts, adapter = built
    for ex in _examples():
        messages = [
            {"role": "user", "content": [{"type": "audio", "audio": "clip"}, {"type": "text", "text": ex["question"]}]}
        ]
        text = parts.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        proc = parts.processor(
            text=text, audio=[ex["wav"].numpy()], sampling_rate=16000, return_tensors="pt", add_special_tokens=False
        )
        ours = adapter.collate([ex], with_answers=False)
        assert ours["input_ids"][0].tolist() == proc["input_ids"][0].tolist()
        assert torch.equal(ours["feature_attention_mask"], proc["feature_attention_mask"])
        assert torch.allclose(ours["input_features"], proc["input_features"])
        assert ours["input_features"].shape[-1] == 300  # the 3 s window


def test_a_short_window_gives_the_full_windows_outputs():
    """Padded positions are masked in the tower, so the 3 s window reproduces Whisper's 30 s one on a clip."""
    whisper, lm, tok = _parts()
    short = assemble(whisper, lm, tok, window_seconds=3)
    whisper, lm, tok = _parts()
    full = assemble(whisper, lm, tok, window_seconds=30)
    wav = _examples()[1]["wav"].numpy()
    outs = []
    for parts in (short, full):
        f = parts.processor.feature_extractor(
            [wav], sampling_rate=16000, padding="max_length", return_attention_mask=True, return_tensors="pt"
        )
        with torch.no_grad():
            outs.append(tower_outputs(parts.model, f["input_features"], f["attention_mask"])[0])
    assert outs[0].shape == outs[1].shape == (31, 16)
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert not torch.allclose(outs[0][:, 0], outs[0][:, 1])  # not a constant output


def test_cached_tower_outputs_give_the_full_forwards_logits(built, tmp_path):
    _, _, _, adapter = built
    examples = _examples()
    cache = TowerCache(tmp_path, tower_digest(adapter))
    cache.fill(adapter, examples, batch_size=3)
    with torch.no_grad():
        full = adapter.model(**adapter.model_inputs(adapter.collate(examples))).logits[:, :-1]
        got, targets = cached_logits(adapter.model, cached_collate(adapter, cache)(examples))
        scored, scored_targets = cached_logits(
            adapter.model, cached_collate(adapter, cache)(examples), scored_only=True
        )
    assert got.shape == full.shape and torch.allclose(got, full, atol=1e-5)
    keep = targets != -100
    assert torch.allclose(scored, full[keep], atol=1e-5) and torch.equal(scored_targets, targets[keep])
    again = TowerCache(tmp_path, tower_digest(adapter))  # read back from disk
    assert len(again) == len(examples) and torch.equal(
        again.outputs[clip_key(examples[0])], cache.outputs[clip_key(examples[0])]
    )
    assert len(TowerCache(tmp_path, "another-tower")) == 0


def test_the_folder_round_trips_and_is_a_speech_llm(built, tmp_path):
    _, _, parts, adapter = built
    folder = parts.save(tmp_path / "model")
    assert kind_of(folder).name == "speech-llm" and family_of_dir(folder)[0] is FAMILIES["qwen2_audio_llama"]
    plain = Qwen2AudioForConditionalGeneration.from_pretrained(str(folder)).eval()
    loaded = api.load_model(folder, device="cpu")
    assert isinstance(loaded, SpeechLLMAdapter) and loaded.family.name == "qwen2_audio_llama"
    batch = adapter.collate(_examples())
    with torch.no_grad():
        want = adapter.model(**adapter.model_inputs(batch)).logits
        assert torch.allclose(plain(**adapter.model_inputs(batch)).logits, want, atol=1e-5)
        assert torch.allclose(loaded.model(**loaded.model_inputs(loaded.collate(_examples()))).logits, want, atol=1e-5)


def test_projector_training_lowers_the_loss_and_moves_the_projector_only(tmp_path):
    whisper, lm, tok = _parts()
    parts = assemble(whisper, lm, tok, window_seconds=3)
    adapter = SpeechLLMAdapter(
        parts.model, parts.tokenizer, parts.processor.feature_extractor, processor=parts.processor
    )
    examples = _examples()
    cache = TowerCache(tmp_path, tower_digest(adapter))
    cache.fill(adapter, examples)
    before = {n: p.detach().clone() for n, p in adapter.model.named_parameters()}
    with torch.no_grad():
        loss0 = adapter.loss(adapter.collate(examples)).item()
    result = train_from_cache(adapter, examples, cache, TrainConfig(epochs=15, batch_size=4, lr=1e-2))
    with torch.no_grad():
        loss1 = adapter.loss(adapter.collate(examples)).item()
    # trained on the cache, measured through the full forward (tower included): a tiny random LM gives the audio
    # little say in its answers, so the drop is small, but an untrained projector or a cache path that is not
    # the model's forward would give none
    assert loss1 < loss0 - 0.02 and result.losses[-1] < result.losses[0]
    moved = {n for n, p in adapter.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"model.multi_modal_projector.linear.weight", "model.multi_modal_projector.linear.bias"}
    with pytest.raises(ValueError, match="no cached tower outputs"):
        train_from_cache(adapter, [{**examples[0], "wav": torch.zeros(4000)}], cache, TrainConfig(epochs=1))
