"""Speech LLMs built from configs (random init, never downloaded): size presets, tokenizer, feature extractor.

``tiny`` is for tests (a few hundred thousand parameters); ``mini`` is the CPU demo model that
learns the built-in synthetic corpus in minutes. A built model gets a byte-level BPE trained on
the task texts plus its family's special tokens (every id below ``vocab_size``), a Whisper
feature extractor sized to the audio tower (``feature_size = num_mel_bins``; for Qwen2-Audio
``chunk_length`` makes the padded window exactly ``2 * max_source_positions`` frames), and a
ChatML chat template in the family's audio markup.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mmunlearn.adapters.speech_llm.families import FAMILIES, Family
from mmunlearn.adapters.text.tokenizer import train_bpe

SAMPLE_RATE = 16000
HOP = 160  # Whisper: 10 ms frames


@dataclass(frozen=True)
class SpeechArch:
    """Sizes of a speech LLM built from a config (the same fields serve all three families)."""

    family: str = "qwen2_5_omni"
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 64
    audio_d: int = 16
    audio_layers: int = 2
    audio_heads: int = 2
    audio_ffn: int = 32
    mel_bins: int = 16
    chunk_seconds: int = 4  # feature-extractor window: longer clips are cut
    n_window: int = 50  # Omni audio towers attend within chunks of 2 * n_window frames
    experts: int = 4  # Qwen3-Omni only
    experts_per_token: int = 2
    expert_intermediate: int = 16
    vocab_size: int = 512
    max_positions: int = 1024

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose one of {sorted(FAMILIES)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ValueError(
                f"hidden {self.hidden} / heads {self.heads} must give a head_dim divisible by 4 "
                "(the mrope sections split head_dim / 2 three ways)"
            )
        if self.audio_d % self.audio_heads:
            raise ValueError(f"audio_d {self.audio_d} is not divisible by audio_heads {self.audio_heads}")
        if self.family == "qwen3_omni" and self.mel_bins % 8:
            raise ValueError(f"Qwen3-Omni downsamples the mel axis by 8: mel_bins {self.mel_bins} must be a multiple")

    @property
    def window_frames(self) -> int:
        return self.chunk_seconds * SAMPLE_RATE // HOP

    def mrope_section(self) -> list[int]:
        """Three sections summing to head_dim / 2 (temporal gets the remainder)."""
        half = self.hidden // self.heads // 2
        hw = half // 4 + (1 if half % 4 else 0)
        return [half - 2 * hw, hw, hw]


PRESETS: dict[str, SpeechArch] = {
    "tiny": SpeechArch(),
    # Qwen2.5-Omni-thinker-shaped, ~0.5M parameters, 3 s of audio (the real n_window of 100 frames).
    "mini": SpeechArch(
        hidden=96,
        layers=3,
        heads=4,
        kv_heads=2,
        intermediate=192,
        audio_d=64,
        audio_layers=2,
        audio_heads=4,
        audio_ffn=128,
        mel_bins=80,
        chunk_seconds=3,
        n_window=100,
        vocab_size=768,
    ),
}


def arch_for(preset: str | SpeechArch, family: str | None = None, **overrides: Any) -> SpeechArch:
    """A preset (by name) with its family and any field replaced."""
    if isinstance(preset, SpeechArch):
        arch = preset
    elif preset in PRESETS:
        arch = PRESETS[preset]
    else:
        raise ValueError(f"unknown speech-LLM preset {preset!r}; choose one of {sorted(PRESETS)}")
    if family is not None:
        overrides["family"] = family
    return replace(arch, **overrides) if overrides else arch


def build_tokenizer(family: Family, texts: Iterable[str], vocab_size: int = 512):
    """Byte-level BPE on ``texts`` plus the family's special tokens and chat template; EOS is its end of turn."""
    n_special = len(family.special_tokens)
    tok = train_bpe(texts, vocab_size=vocab_size - n_special, min_frequency=1)
    tok.add_tokens(family.special_tokens, special_tokens=True)
    tok.eos_token = family.turn_end
    tok.chat_template = family.chat_template
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens, more than vocab_size {vocab_size}")
    return tok


def build_feature_extractor(arch: SpeechArch):
    """A Whisper log-mel extractor with the tower's mel bins and window (16 kHz, 10 ms hop, 25 ms FFT)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=arch.mel_bins,
        sampling_rate=SAMPLE_RATE,
        hop_length=HOP,
        chunk_length=arch.chunk_seconds,
        n_fft=400,
        return_attention_mask=True,
    )


def _ids(tok, family: Family) -> dict[str, int]:
    ids = {t: tok.convert_tokens_to_ids(t) for t in family.special_tokens}
    missing = [t for t, i in ids.items() if i is None or i == tok.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks the {family.name} special tokens {missing}")
    return ids


def build_config(arch: SpeechArch, tok):
    """The transformers config of ``arch`` with the tokenizer's special-token ids."""
    import transformers as tf

    fam = FAMILIES[arch.family]
    ids = _ids(tok, fam)
    vocab = max(arch.vocab_size, len(tok))
    common = dict(
        vocab_size=vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        max_position_embeddings=arch.max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=ids[fam.turn_end],
    )
    audio = dict(
        num_mel_bins=arch.mel_bins,
        encoder_layers=arch.audio_layers,
        encoder_attention_heads=arch.audio_heads,
        encoder_ffn_dim=arch.audio_ffn,
        d_model=arch.audio_d,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": arch.mrope_section()}
    if fam.model_class == "Qwen2AudioForConditionalGeneration":  # the Qwen2-Audio rows: Qwen2 or their named LM
        text_type = fam.text_model_types[0] if fam.text_model_types else "qwen2"
        text = dict(model_type=text_type, **common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        audio = dict(model_type="qwen2_audio_encoder", **audio, max_source_positions=arch.window_frames // 2)
        return tf.Qwen2AudioConfig(text_config=text, audio_config=audio, audio_token_index=ids[fam.audio_token])
    image, video, vstart, _ = (ids[t] for t in fam.vision_tokens)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=arch.hidden)
    audio |= dict(n_window=arch.n_window, output_dim=arch.hidden, max_source_positions=max(arch.n_window, 64))
    if arch.family == "qwen2_5_omni":
        return tf.Qwen2_5OmniThinkerConfig(
            text_config=dict(**common, rope_parameters=rope),
            audio_config=audio,
            vision_config=vision | dict(fullatt_block_indexes=[0]),
            audio_token_index=ids[fam.audio_token],
            image_token_index=image,
            video_token_index=video,
            audio_start_token_id=ids[fam.audio_bos],
            audio_end_token_id=ids[fam.audio_eos],
            user_token_id=ids[fam.turn_start],
            vision_start_token_id=vstart,
        )
    text = dict(
        **common,
        rope_parameters=rope | {"interleaved": True},
        num_experts=arch.experts,
        num_experts_per_tok=arch.experts_per_token,
        moe_intermediate_size=arch.expert_intermediate,
    )
    audio |= dict(downsample_hidden_size=8, n_window_infer=2 * arch.n_window, conv_chunksize=50)
    return tf.Qwen3OmniMoeThinkerConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision | dict(deepstack_visual_indexes=[0]),
        audio_token_id=ids[fam.audio_token],
        image_token_id=image,
        video_token_id=video,
        audio_start_token_id=ids[fam.audio_bos],
        user_token_id=ids[fam.turn_start],
        vision_start_token_id=vstart,
    )


def build_model(arch: SpeechArch, tok, seed: int = 0) -> torch.nn.Module:
    """A seeded random-init model of ``arch`` (the global RNG is left as it was)."""
    config = build_config(arch, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FAMILIES[arch.family].model_cls()(config)
    return model.eval()


def arch_summary(arch: SpeechArch, model: torch.nn.Module) -> dict[str, Any]:
    """Sizes and parameter counts (total, audio tower, language model) for logs."""
    audio = sum(p.numel() for n, p in model.named_parameters() if "audio_tower" in n or "multi_modal" in n)
    vision = sum(p.numel() for n, p in model.named_parameters() if "visual." in n)
    total = sum(p.numel() for p in model.parameters())
    return {
        **asdict(arch),
        "parameters": total,
        "audio_parameters": audio,
        "unused_vision_parameters": vision,
        "text_parameters": total - audio - vision,
        "window_frames": arch.window_frames,
        "max_audio_tokens": FAMILIES[arch.family].audio_tokens(arch.window_frames, arch.n_window),
    }
