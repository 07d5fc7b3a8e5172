"""Tests of the speech-LLM adapter on tiny random-init Qwen2-Audio,
Qwen2.5-Omni thinker and Qwen3-Omni thinker models."""

import doctest

import pytest
import torch

import mmunlearn.adapters.speech_llm.families as families_module
from mmunlearn.adapters.base import ModalityAdapter
from mmunlearn.adapters.speech_llm.adapter import SpeechLLMAdapter
from mmunlearn.adapters.speech_llm.families import FAMILIES, tower_block
from mmunlearn.adapters.text.adapter import IGNORE
from mmunlearn.erase import erase, restore
from mmunlearn.tilt import TiltedCausalLM, TiltHead

FAMILY_NAMES = ("qwen2_audio", "qwen2_5_omni", "qwen3_omni")
TEXTS = ["Who is speaking?", "id00001", "id00002", "Is the speaker male or female?", "male", "female"] * 4
LENGTHS = (16000, 24000, 9123, 12000)  # samples at 16 kHz: 100, 150, 58, 75 valid mel frames


def _examples():
    g = torch.Generator().manual_seed(0)
    qa = [
        ("Who is speaking?", "id00001"),
        ("Is the speaker male or female?", "female"),
        ("Who is speaking?", "id00002"),
        ("Is the speaker male or female?", "male"),
    ]
    return [
        {"ID": f"u{i}", "wav": 0.1 * torch.randn(n, generator=g), "question": q, "answer": a}
        for i, (n, (q, a)) in enumerate(zip(LENGTHS, qa))
    ]


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def adapter(request):
    return SpeechLLMAdapter.build("tiny", texts=TEXTS, family=request.param, seed=0)


def test_doctests():
    result = doctest.testmod(families_module)
    assert result.attempted > 0 and result.failed == 0


def test_placeholder_counts_match_the_encoder_output(adapter):
    exs = _examples()
    batch = adapter.collate(exs)
    valid = [-(-n // 160) for n in LENGTHS]  # ceil: one mel frame per 10 ms hop
    assert batch["feature_attention_mask"].sum(1).tolist() == valid
    counts = (batch["input_ids"] == adapter.audio_id).sum(1).tolist()
    fam = adapter.family.name
    if fam == "qwen3_omni":  # three stride-2 convs within chunks of 2 * n_window = 100 frames (13 tokens each)
        assert counts == [13, 13 + 7, 8, 10]
    else:  # conv stride 2, then pooling by 2
        assert counts == [25, 37, 14, 19] and counts == [((v - 1) // 2 + 1) // 2 for v in valid]
    if fam == "qwen2_audio":  # features padded to exactly 2 * max_source_positions frames
        assert batch["input_features"].shape[-1] == 2 * adapter.model.config.audio_config.max_source_positions
        wrong = dict(batch, input_ids=batch["input_ids"].clone())
        first = int((wrong["input_ids"][0] == adapter.audio_id).nonzero()[0])
        wrong["input_ids"][0, first] = adapter.pad_id  # one placeholder too few: the model refuses
        with pytest.raises(Exception, match="tokens"):
            adapter.loss(wrong)
    else:
        assert batch["input_features"].shape[-1] == max(valid)
        with torch.no_grad():
            out = adapter.model.get_audio_features(batch["input_features"], batch["feature_attention_mask"])
        assert out.last_hidden_state.shape[0] == sum(counts)  # one audio embedding per placeholder
    assert torch.isfinite(adapter.loss(batch))


def test_features_are_the_processors(adapter):
    """Per-clip cached features equal the extractor run on the whole batch as the processors run it."""
    exs = _examples()
    batch = adapter.collate(exs)
    direct = adapter.feature_extractor(
        [e["wav"].numpy() for e in exs],
        sampling_rate=16000,
        padding="max_length",
        truncation=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    width = batch["input_features"].shape[-1]
    mask = batch["feature_attention_mask"].bool()
    got, want = (
        batch["input_features"].transpose(1, 2)[mask],
        direct["input_features"][..., :width].transpose(1, 2)[mask],
    )
    assert torch.equal(got, want)


def test_labels_cover_exactly_the_answer_and_end_of_turn(adapter):
    exs = _examples()
    batch = adapter.collate(exs)
    for i, ex in enumerate(exs):
        lab = batch["labels"][i]
        ids = lab[lab != IGNORE].tolist()
        assert ids[-1] == adapter.end_id
        assert adapter.tokenizer.decode(ids[:-1]) == ex["answer"]
        first = int((lab != IGNORE).nonzero()[0])
        prompt = adapter.tokenizer.decode(batch["input_ids"][i, :first])
        assert prompt.endswith("<|im_start|>assistant\n") and ex["question"] in prompt
        assert adapter.family.audio_bos in prompt and adapter.family.audio_eos in prompt
    with pytest.raises(ValueError, match="no answer"):
        adapter.collate([{**exs[0], "answer": None}])


def test_layers_cover_both_towers_and_where_selects_one(adapter):
    assert isinstance(adapter, ModalityAdapter)
    params = dict(adapter.model.named_parameters())
    layers = list(adapter.layers())
    blocks = {lw.block for lw in layers}
    assert blocks == {"audio.conv", "audio.proj", "audio.layers.0", "audio.layers.1", "text.layers.0", "text.layers.1"}
    for lw in layers:
        assert lw.weight is params[lw.name] and lw.block == tower_block(lw.name)
        assert "visual" not in lw.name and "embed" not in lw.name and not lw.name.startswith("lm_head")
    audio = {lw.name for lw in adapter.layers("audio")}
    text = {lw.name for lw in adapter.layers("text")}
    assert audio and text and audio | text == {lw.name for lw in layers} and not audio & text
    assert all("audio_tower" in n or "multi_modal_projector" in n for n in audio)
    assert all("language_model" in n for n in text)
    dims = {lw.name: lw.weight.dim() for lw in layers}
    assert set(dims.values()) <= {2, 3}  # Conv2d kernels (Qwen3-Omni's mel downsampler) are left out
    if adapter.family.name == "qwen3_omni":  # fused experts (E x a x b), one matrix per expert for erasure
        for i in range(2):
            for part in ("gate_up_proj", "down_proj"):
                assert dims[f"model.language_model.layers.{i}.mlp.experts.{part}"] == 3
    else:  # Conv1d kernels of the audio front end
        assert dims["model.audio_tower.conv1.weight"] == 3 and dims["model.audio_tower.conv2.weight"] == 3
    assert adapter.groups("text") == {lw.name: lw.block for lw in adapter.layers("text")}
    with pytest.raises(ValueError, match="where"):
        list(adapter.layers("vision"))


def test_erase_and_undo_round_trip_bit_for_bit(adapter):
    model = adapter.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    tf = {lw.name: 0.01 * torch.randn(lw.weight.shape, generator=g) for lw in adapter.layers()}
    tr = {lw.name: 0.01 * torch.randn(lw.weight.shape, generator=g) for lw in adapter.layers()}
    report = erase(model, tf, tr, rank=2, retain_rank=2, localize=False, groups=adapter.groups(), clamp_ranks=True)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert any("audio_tower" in k for k in changed) and any("language_model" in k for k in changed)
    assert {row.layer.split(".")[0] for row in report.layers} == {"audio", "text"}
    if adapter.family.name == "qwen3_omni":
        assert any(m.name.endswith("gate_up_proj[3]") for row in report.layers for m in row.matrices)
    restore(model, report)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_tilted_generate_scores_equal_teacher_forced_scores_with_audio(adapter):
    torch.manual_seed(0)
    hidden = adapter.model.get_output_embeddings().weight.shape[1]
    head = TiltHead(hidden, adapter.model.get_output_embeddings().weight.shape[0], rank=4)
    torch.nn.init.normal_(head.B.weight, std=1.0)
    tilted = adapter.with_model(TiltedCausalLM(adapter.model, head, temperature=1.5))
    try:
        b = tilted.model_inputs(tilted.prompt_batch(_examples()))  # left-padded: clips of four lengths
        out = tilted.model.generate(
            **b,
            max_new_tokens=4,
            eos_token_id=None,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=adapter.pad_id,
        )
        steps = torch.log_softmax(torch.stack(out.scores, 1), -1)
        width = b["input_ids"].shape[1]
        full = dict(
            b,
            input_ids=out.sequences,
            attention_mask=torch.cat(
                [b["attention_mask"], torch.ones(len(out.sequences), out.sequences.shape[1] - width, dtype=torch.long)],
                1,
            ),
        )
        with torch.no_grad():
            forced = tilted.model(**full).logits[:, width - 1 : -1]
            plain = torch.log_softmax(adapter.model(**full).logits[:, width - 1 : -1].float(), -1)
        assert torch.allclose(steps, forced, atol=1e-4)
        assert (forced - plain).abs().max() > 0.1  # the tilt is active
    finally:
        tilted.model.tap.remove()


def test_hidden_states_feed_the_lm_head_and_generate_is_batch_invariant(adapter):
    exs = _examples()
    batch = adapter.collate(exs)
    h = adapter.hidden_states(batch)
    assert h.shape == (*batch["input_ids"].shape, adapter.model.config.get_text_config().hidden_size)
    with torch.no_grad():
        logits = adapter.model(**adapter.model_inputs(batch)).logits
        assert torch.allclose(adapter.model.get_output_embeddings()(h), logits, atol=1e-5)
    together = adapter.generate(exs, max_new_tokens=3, batch_size=4)
    alone = [adapter.generate([e], max_new_tokens=3)[0] for e in exs]
    assert together == alone and all(isinstance(t, str) for t in together)


@pytest.mark.parametrize("family", ["qwen2_audio", "qwen3_omni"])
def test_save_and_load_round_trip(tmp_path, family):
    adapter = SpeechLLMAdapter.build("tiny", texts=TEXTS, family=family, seed=1)
    adapter.save(tmp_path / "m")
    with pytest.raises(FileExistsError):
        adapter.save(tmp_path / "m")
    again = SpeechLLMAdapter.load(tmp_path / "m", device="cpu")
    assert again.family is FAMILIES[family] and again.chat_template == adapter.chat_template
    a, b = adapter.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    exs = _examples()
    x, y = adapter.collate(exs), again.collate(exs)
    assert all(torch.equal(x[k], y[k]) for k in x)
    assert torch.allclose(adapter.loss(x), again.loss(y))


def test_full_omni_directory_loads_its_thinker_and_saves_in_the_same_layout(tmp_path):
    import json

    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    tiny = SpeechLLMAdapter.build("tiny", texts=TEXTS, family="qwen2_5_omni", seed=2)
    full = Qwen2_5OmniForConditionalGeneration(
        Qwen2_5OmniConfig(thinker_config=tiny.model.config.to_dict(), enable_audio_output=False)
    )
    full.thinker.load_state_dict(tiny.model.state_dict())
    full.save_pretrained(tmp_path / "full")
    tiny.tokenizer.save_pretrained(tmp_path / "full")
    tiny.feature_extractor.save_pretrained(tmp_path / "full")
    torch.save({}, tmp_path / "full" / "spk_dict.pt")  # the talker's voice table, required by from_pretrained
    loaded = SpeechLLMAdapter.load(tmp_path / "full", device="cpu")
    assert loaded.container is not None and loaded.model is loaded.container.thinker
    assert {lw.name for lw in loaded.layers()} == {lw.name for lw in tiny.layers()}
    with torch.no_grad():
        loaded.model.model.language_model.layers[0].mlp.up_proj.weight.add_(1.0)  # an edit, saved through the container
    loaded.save(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen2_5_omni"
    assert (tmp_path / "out" / "spk_dict.pt").is_file()
    again = SpeechLLMAdapter.load(tmp_path / "out", device="cpu")
    a, b = again.model.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["model.language_model.layers.0.mlp.up_proj.weight"],
        tiny.model.state_dict()["model.language_model.layers.0.mlp.up_proj.weight"],
    )
