"""TiltedCausalLM: a frozen causal LM plus a tilt head, scored and sampled as T3's distribution.

``forward`` returns the normalised tilted log-probs log_softmax(log p / T + log f) at every
position as ``logits`` (teacher forced), so every metric, MIA and ROUGE run on it unchanged;
``generate`` delegates to the base model's generate with the hidden-state tap and the
``TemperThenTilt`` processor attached, so its per-step scores equal the teacher-forced ones.
Only the head and its settings are saved, next to a reference to the base model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LogitsProcessorList
from transformers.modeling_outputs import CausalLMOutputWithPast

from mmunlearn.adapters.text_llm import TextLLMAdapter
from mmunlearn.checkpoint import atomic_dir
from mmunlearn.tilt.head import TiltHead
from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.tilt.processor import TemperThenTilt, check_strength, tilt_logprobs

CONFIG_NAME = "tilt_config.json"
HEAD_NAME = "tilt_head.safetensors"


class TiltedCausalLM(nn.Module):
    """Frozen base LM + tilt head; the T3 distribution p^(1/T) f, renormalised."""

    def __init__(self, base: nn.Module, head: TiltHead | None, temperature: float = 1.0, base_path: str | None = None,
                 strength: float = 1.0):
        super().__init__()
        if not temperature >= 1.0:
            raise ValueError(f"T3 tempers with T >= 1, got temperature={temperature}")
        self.base = base.eval()
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.head = head
        self.temperature = float(temperature)
        self.strength = check_strength(strength)
        self.base_path = base_path
        self.tap = HiddenStateTap(base.base_model)
        self.config = base.config
        self.generation_config = base.generation_config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> CausalLMOutputWithPast:
        if attention_mask is not None and "position_ids" not in kwargs and kwargs.get("past_key_values") is None:
            # positions as generate() numbers them, so left-padded rows score as they generate
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = tilt_logprobs(out.logits, self.tap.states, self.head, self.temperature, self.strength)
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                      hidden_states=getattr(out, "hidden_states", None))

    def generate(self, *args, **kwargs) -> torch.Tensor:
        """The base model's generate, tilted. Sampling uses temperature 1 and no top-k/top-p:
        the processor already tempers, and warping would change the T3 distribution."""
        for key, neutral in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)):
            if kwargs.get(key, neutral) != neutral:
                raise ValueError(f"{key}={kwargs[key]} would distort T3 sampling; set the temperature on the model")
            kwargs[key] = neutral
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(TemperThenTilt(self.head, self.tap, self.temperature, self.strength))
        return self.base.generate(*args, logits_processor=processors, **kwargs)

    def get_output_embeddings(self):
        return self.base.get_output_embeddings()

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Store the head and settings (not the base weights) in a new directory."""
        cfg = {"temperature": self.temperature, "strength": self.strength, "base_model": self.base_path,
               "head": None if self.head is None else self.head.config}
        with atomic_dir(path, overwrite=overwrite) as tmp:
            (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2))
            if self.head is not None:
                save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}, str(tmp / HEAD_NAME))
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, base: nn.Module | None = None, device: str = "auto") -> "TiltedCausalLM":
        """Load a saved tilt; the base model comes from ``base`` or the stored reference."""
        path = Path(path)
        if not (path / CONFIG_NAME).is_file():
            raise FileNotFoundError(f"{path} has no {CONFIG_NAME}: not a saved tilted model")
        cfg = json.loads((path / CONFIG_NAME).read_text())
        if base is None:
            if not cfg.get("base_model"):
                raise ValueError(f"{path} does not record its base model; pass base=")
            base = TextLLMAdapter.from_pretrained(cfg["base_model"], device=device).model
        head = None
        if cfg.get("head"):
            head = TiltHead(**cfg["head"])
            head.load_state_dict(load_file(str(path / HEAD_NAME)))
            head.to(next(base.parameters()).device)
        return cls(base, head, cfg["temperature"], base_path=cfg.get("base_model"), strength=cfg.get("strength", 1.0))
