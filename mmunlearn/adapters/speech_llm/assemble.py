"""A Qwen2-Audio-architecture speech LLM assembled from parts: a Whisper encoder as the audio tower, a causal LM.

transformers' ``Qwen2AudioForConditionalGeneration`` builds its audio tower (a Whisper-shaped
``qwen2_audio_encoder``) and its language model from configs, so any Whisper encoder and any causal LM
(here a Llama-family one: SmolLM2) fit into it. :func:`assemble` copies the encoder's weights into the
tower (same names: Qwen2-Audio's encoder is Whisper's with average pooling by 2 before the final layer norm),
the LM's into ``language_model`` and ``lm_head``, adds the family's audio markup tokens to the LM's tokenizer
(their embeddings start at the mean of the others), sets the family's chat template, and builds the
``Qwen2AudioProcessor`` that expands the audio placeholder into one token per encoder output. Only the
projector (``multi_modal_projector.linear``, audio width -> LM width) is new; it is drawn from ``seed``.

**The window.** Qwen2-Audio pads the log-mel features to a fixed window (``2 * max_source_positions``
frames) and masks the padded positions in the tower's self-attention, so a clip's outputs do not depend on
how long the window is past the clip (the convolutions are local, positions are absolute): ``window_seconds``
keeps the first ``50 * window_seconds`` positions of Whisper's 1500 (30 s), and clips up to that long get the
outputs they would get in the full window at a tenth of the cost (``tests/adapters/test_speech_llm_assemble.py``
checks the equality). Longer clips are cut by the feature extractor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mmunlearn.adapters.speech_llm.families import FAMILIES, Family
from mmunlearn.files.checkpoint import atomic_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2AudioForConditionalGeneration

#: Encoder positions per second of audio (Whisper: 100 mel frames per second, conv2 stride 2).
POSITIONS_PER_SECOND = 50
SAMPLE_RATE, HOP = 16000, 160
#: The Whisper config fields the tower's config copies.
_AUDIO_FIELDS = (
    "num_mel_bins",
    "encoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "d_model",
    "activation_function",
    "scale_embedding",
)


@dataclass
class Assembled:
    """The assembled model, its tokenizer (with the audio tokens and chat template) and its processor."""

    model: Qwen2AudioForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    processor: Any  # Qwen2AudioProcessor

    def save(self, path: str | os.PathLike, *, overwrite: bool = False, extra: dict[str, str] | None = None) -> Path:
        """A ``save_pretrained`` folder (model, tokenizer, processor; ``extra``: name -> side-file text), atomically."""
        with atomic_dir(path, overwrite=overwrite) as tmp:
            self.model.save_pretrained(tmp)
            self.processor.save_pretrained(tmp)
            for name, text in (extra or {}).items():
                (tmp / name).write_text(text)
        return Path(path)


def _family(family: str | Family) -> Family:
    fam = FAMILIES[family] if isinstance(family, str) else family
    if fam.model_class != "Qwen2AudioForConditionalGeneration":
        raise ValueError(f"family {fam.name!r} is not a Qwen2-Audio architecture; assembly builds Qwen2-Audio models")
    return fam


def whisper_encoder(whisper: nn.Module) -> nn.Module:
    """The encoder of a ``WhisperForConditionalGeneration`` / ``WhisperModel`` (or the encoder itself)."""
    if hasattr(whisper, "get_encoder"):
        return whisper.get_encoder()
    if type(whisper).__name__ == "WhisperEncoder":
        return whisper
    raise ValueError(f"{type(whisper).__name__} is not a Whisper model or encoder")


def audio_config(whisper_config: Any, window_seconds: int) -> dict[str, Any]:
    """The tower's config (a ``qwen2_audio_encoder``) from a ``WhisperConfig``, with the window's positions."""
    positions = POSITIONS_PER_SECOND * int(window_seconds)
    if not 1 <= positions <= whisper_config.max_source_positions:
        raise ValueError(
            f"window_seconds={window_seconds}: {positions} positions, the encoder has "
            f"{whisper_config.max_source_positions}"
        )
    return {
        "model_type": "qwen2_audio_encoder",
        "max_source_positions": positions,
        **{k: getattr(whisper_config, k) for k in _AUDIO_FIELDS},
    }


def add_audio_tokens(tokenizer: PreTrainedTokenizerBase, family: str | Family) -> dict[str, int]:
    """Add the family's audio markup tokens (special) and chat template to ``tokenizer``; token -> id."""
    fam = _family(family)
    for token in (fam.turn_start, fam.turn_end):
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {token!r}: family {fam.name!r} needs its ChatML turn tokens")
    tokenizer.add_tokens(fam.audio_special_tokens, special_tokens=True)
    tokenizer.chat_template = fam.chat_template
    return {t: tokenizer.convert_tokens_to_ids(t) for t in fam.audio_special_tokens}


def _grow_embeddings(lm: PreTrainedModel, size: int) -> None:
    """Resize the LM's embeddings (and untied head) to ``size`` rows; new rows = the mean of the old ones."""
    old = lm.get_input_embeddings().weight.shape[0]
    if size < old:
        raise ValueError(f"the tokenizer has {size} tokens, fewer than the LM's {old} embeddings")
    lm.resize_token_embeddings(size, mean_resizing=False)
    with torch.no_grad():
        layers = (lm.get_input_embeddings(), lm.get_output_embeddings())
        for layer in {id(m): m for m in layers if m is not None}.values():  # a tied head once
            layer.weight[old:] = layer.weight[:old].mean(0)


def _load_tower(tower: nn.Module, encoder: nn.Module) -> None:
    """Whisper encoder weights into the Qwen2-Audio tower (same names; the positions of the window only)."""
    state = encoder.state_dict()
    positions = tower.embed_positions.weight.shape[0]
    state["embed_positions.weight"] = state["embed_positions.weight"][:positions]
    missing, unexpected = tower.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"Whisper encoder -> Qwen2-Audio tower: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def _feature_extractor(whisper_fe: Any, n_mels: int, window_seconds: int):
    """Whisper's feature extractor with the window's length (the same log-mel features of a clip's frames)."""
    from transformers import WhisperFeatureExtractor  # deferred: transformers is heavy

    if whisper_fe is not None and (whisper_fe.sampling_rate != SAMPLE_RATE or whisper_fe.hop_length != HOP):
        raise ValueError("the Whisper feature extractor must sample at 16 kHz with a 10 ms hop")
    n_fft = whisper_fe.n_fft if whisper_fe is not None else 400
    return WhisperFeatureExtractor(
        feature_size=n_mels,
        sampling_rate=SAMPLE_RATE,
        hop_length=HOP,
        chunk_length=int(window_seconds),
        n_fft=n_fft,
        return_attention_mask=True,
    )


def assemble(
    whisper: nn.Module,
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    whisper_feature_extractor: Any = None,
    family: str | Family = "qwen2_audio_llama",
    window_seconds: int = 3,
    seed: int = 0,
) -> Assembled:
    """A Qwen2-Audio model from a Whisper model (its encoder) and a causal LM with its tokenizer (see the module
    notes). ``lm`` and ``tokenizer`` are changed (tokens added, embeddings grown); ``whisper`` is only read."""
    import transformers as tf  # deferred: transformers is heavy

    fam = _family(family)
    encoder = whisper_encoder(whisper)
    text_type = lm.config.model_type
    if fam.text_model_types and text_type not in fam.text_model_types:
        raise ValueError(f"family {fam.name!r} holds {fam.text_model_types} language models, got {text_type!r}")
    ids = add_audio_tokens(tokenizer, fam)
    _grow_embeddings(lm, len(tokenizer))
    text = lm.config.to_dict()
    text["tie_word_embeddings"] = False  # Qwen2-Audio's lm_head is its own Linear: the LM's head is copied
    config = tf.Qwen2AudioConfig(
        audio_config=audio_config(encoder.config, window_seconds),
        text_config=text,
        audio_token_index=ids[fam.audio_token],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.Qwen2AudioForConditionalGeneration(config)
    _load_tower(model.model.audio_tower, encoder)
    inner = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
    missing, unexpected = model.model.language_model.load_state_dict(inner.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"LM -> language_model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    with torch.no_grad():
        model.lm_head.weight.copy_(lm.get_output_embeddings().weight)
    model.generation_config = tf.GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(fam.turn_end), pad_token_id=tokenizer.pad_token_id
    )
    fe = _feature_extractor(whisper_feature_extractor, encoder.config.num_mel_bins, window_seconds)
    processor = tf.Qwen2AudioProcessor(
        feature_extractor=fe,
        tokenizer=tokenizer,
        chat_template=fam.chat_template,
        audio_token=fam.audio_token,
        audio_bos_token=fam.audio_bos,
        audio_eos_token=fam.audio_eos,
    )
    return Assembled(model.eval(), tokenizer, processor)
