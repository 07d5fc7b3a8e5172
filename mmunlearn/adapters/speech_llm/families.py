"""The speech-LLM families the speech adapter knows: Qwen2-Audio, Qwen2.5-Omni thinker, Qwen3-Omni (MoE) thinker,
and the Qwen2-Audio architecture around a Llama-family language model (a Whisper encoder + SmolLM2, assembled here).

A :class:`Family` holds what differs between them: the transformers classes, the audio
placeholder tokens, whether the mel features are padded to the encoder's fixed window, how many
placeholder tokens a clip of F valid mel frames becomes, and the chat format a model built here
uses (the turn tokens and the text around the audio markup). A row may name the language models it
holds (``text_model_types``): a folder's family is the row naming its ``text_config.model_type``, else
the row that names none. Parameter names are sorted into the two towers by pattern (``audio_tower``,
``multi_modal_projector`` / ``language_model``), so transformers 4.x and 5.x layouts both resolve.

>>> FAMILIES["qwen2_5_omni"].audio_tokens(300), FAMILIES["qwen2_audio"].audio_tokens(3000)
(75, 750)
>>> FAMILIES["qwen3_omni"].audio_tokens(300, n_window=50)
39
>>> (tower_block("model.audio_tower.layers.3.fc1.weight"),
...  tower_block("model.language_model.layers.0.mlp.up_proj.weight"))
('audio.layers.3', 'text.layers.0')
>>> tower_block("model.multi_modal_projector.linear.weight"), tower_block("model.audio_tower.conv1.weight")
('audio.proj', 'audio.conv')
>>> tower_block("model.visual.blocks.0.mlp.fc1.weight") is None
True
>>> family_of("qwen2_audio", "llama")[0].name, family_of("qwen2_audio", "qwen2")[0].name
('qwen2_audio_llama', 'qwen2_audio')
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: ``--where`` choices: which tower(s) the methods may touch.
WHERE = ("audio", "text", "both")

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _omni_lengths(frames: int, n_window: int | None = None) -> int:
    """Qwen2-Audio / Qwen2.5-Omni: conv stride 2, then average pooling by 2."""
    after_conv = (frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def _qwen3_lengths(frames: int, n_window: int | None = 50) -> int:
    """Qwen3-Omni: chunks of 2*n_window frames, three stride-2 convs (13 tokens per full 100-frame chunk)."""
    chunk = 2 * int(n_window or 50)
    rest = frames % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


def _template(audio_markup: str, turn_start: str = "<|im_start|>", turn_end: str = "<|im_end|>") -> str:
    """A ChatML chat template whose audio items render as ``audio_markup`` (no default system turn)."""
    return (
        "{% for message in messages %}" + turn_start + "{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for item in message['content'] %}"
        "{% if item['type'] == 'audio' %}"
        + audio_markup
        + "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
        + turn_end
        + "\n{% endfor %}{% if add_generation_prompt %}"
        + turn_start
        + "assistant\n{% endif %}"
    )


@dataclass(frozen=True)
class Family:
    """One model family (see the module notes)."""

    name: str
    model_class: str  # the thinker / audio-LM class
    full_class: str | None  # the full (talker-carrying) model class, when checkpoints ship it
    model_types: tuple[str, ...]  # config.model_type of a thinker-only directory
    full_model_types: tuple[str, ...]  # config.model_type of a full-model directory
    audio_token: str
    audio_bos: str
    audio_eos: str
    pad_to_window: bool  # Qwen2-Audio: mel features exactly 2 * max_source_positions frames
    lengths: Callable[[int, int | None], int]  # (valid mel frames, n_window) -> placeholder tokens
    vision_tokens: tuple[str, ...] = ()  # image, video, vision-start, vision-end (must exist in the vocabulary)
    text_model_types: tuple[str, ...] = ()  # text_config.model_type of the language models it holds (): any
    turn_start: str = "<|im_start|>"  # ChatML turn tokens of the tokenizer
    turn_end: str = "<|im_end|>"  # the end of a turn: what an answer ends with
    audio_prefix: str = ""  # chat text before / after the audio markup
    audio_suffix: str = ""

    def audio_tokens(self, frames: int, n_window: int | None = None) -> int:
        """Placeholder tokens of a clip of ``frames`` valid mel frames (what the encoder outputs)."""
        if frames < 1:
            raise ValueError(f"a clip needs at least one mel frame, got {frames}")
        return int(self.lengths(int(frames), n_window))

    @property
    def special_tokens(self) -> list[str]:
        """Special tokens a tokenizer built for this family must hold."""
        return [self.turn_start, self.turn_end, self.audio_bos, self.audio_token, self.audio_eos, *self.vision_tokens]

    @property
    def audio_special_tokens(self) -> list[str]:
        """The audio markup tokens (what a text tokenizer gains when an audio tower is put in front of its model)."""
        return [self.audio_bos, self.audio_token, self.audio_eos]

    @property
    def chat_template(self) -> str:
        markup = self.audio_prefix + self.audio_bos + self.audio_token + self.audio_eos + self.audio_suffix
        return _template(markup, self.turn_start, self.turn_end)

    def model_cls(self, full: bool = False):
        import transformers

        name = self.full_class if full else self.model_class
        if name is None or not hasattr(transformers, name):
            raise ImportError(f"transformers {transformers.__version__} has no {name} (family {self.name})")
        return getattr(transformers, name)


FAMILIES: dict[str, Family] = {
    "qwen2_audio": Family(
        "qwen2_audio",
        "Qwen2AudioForConditionalGeneration",
        None,
        ("qwen2_audio",),
        (),
        "<|AUDIO|>",
        "<|audio_bos|>",
        "<|audio_eos|>",
        True,
        _omni_lengths,
        audio_prefix="Audio 1: ",
        audio_suffix="\n",
    ),
    # Qwen2-Audio's classes around a Llama-family LM (SmolLM2: ChatML turns); the processor's default audio tokens.
    "qwen2_audio_llama": Family(
        "qwen2_audio_llama",
        "Qwen2AudioForConditionalGeneration",
        None,
        ("qwen2_audio",),
        (),
        "<|AUDIO|>",
        "<|audio_bos|>",
        "<|audio_eos|>",
        True,
        _omni_lengths,
        text_model_types=("llama",),
    ),
    "qwen2_5_omni": Family(
        "qwen2_5_omni",
        "Qwen2_5OmniThinkerForConditionalGeneration",
        "Qwen2_5OmniForConditionalGeneration",
        ("qwen2_5_omni_thinker",),
        ("qwen2_5_omni",),
        "<|AUDIO|>",
        "<|audio_bos|>",
        "<|audio_eos|>",
        False,
        _omni_lengths,
        ("<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>"),
    ),
    "qwen3_omni": Family(
        "qwen3_omni",
        "Qwen3OmniMoeThinkerForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
        ("qwen3_omni_moe_thinker",),
        ("qwen3_omni_moe",),
        "<|audio_pad|>",
        "<|audio_start|>",
        "<|audio_end|>",
        False,
        _qwen3_lengths,
        ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"),
    ),
}


def family_of(model_type: str, text_model_type: str | None = None) -> tuple[Family, bool]:
    """(family, is_full_model) of a ``config.model_type`` (and its ``text_config.model_type``): the row naming
    that language model, else the row naming none."""
    for full in (False, True):
        rows = [f for f in FAMILIES.values() if model_type in (f.full_model_types if full else f.model_types)]
        named = [f for f in rows if text_model_type is not None and text_model_type in f.text_model_types]
        general = [f for f in rows if not f.text_model_types]
        if named or general:
            return (named or general)[0], full
    known = sorted(t for f in FAMILIES.values() for t in (*f.model_types, *f.full_model_types))
    raise ValueError(f"model_type {model_type!r} is not a supported speech LLM; expected one of {known}")


def family_of_dir(path: str | os.PathLike) -> tuple[Family, bool]:
    """Family of a model directory, from its ``config.json``."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a save_pretrained model directory")
    config = json.loads(cfg.read_text())
    text = config.get("text_config") or (config.get("thinker_config") or {}).get("text_config") or {}
    return family_of(config.get("model_type", ""), text.get("model_type") if isinstance(text, dict) else None)


def tower_block(name: str) -> str | None:
    """Layer group of a parameter: ``audio.layers.<i>``, ``audio.conv``, ``audio.proj``, ``text.layers.<i>``,
    ``text.<rest>``; None for parts no method touches (vision tower, talker, code2wav)."""
    if any(part in name for part in ("visual.", "talker.", "token2wav.", "code2wav.")):
        return None
    if "audio_tower." in name:
        tail = name.split("audio_tower.", 1)[1]
        layer = _LAYER.search("." + tail)
        if layer:
            return f"audio.layers.{layer.group(1)}"
        return "audio.conv" if tail.startswith("conv") else "audio.proj"
    if "multi_modal_projector." in name:
        return "audio.proj"
    layer = _LAYER.search(name)
    if layer:
        return f"text.layers.{layer.group(1)}"
    return "text." + name.rsplit(".", 2)[-2] if name.count(".") >= 1 else "text"


def tower_of(block: str) -> str:
    """``audio`` or ``text`` of a layer group made by :func:`tower_block`."""
    return block.split(".", 1)[0]
