"""TiltedCausalLM: a frozen causal LM plus a tilt head, scored and sampled as T3's distribution.

``forward`` returns the normalised tilted log-probs log_softmax(log p / T + log f) at every
position as ``logits`` (teacher forced), so every metric, MIA and ROUGE run on it unchanged;
``generate`` delegates to the base model's generate with the hidden-state tap and the
``TemperThenTilt`` processor attached, so its per-step scores equal the teacher-forced ones.
Only the head and its settings are saved, with the name of the base model's folder: a plain folder name
beside the tilt folder (a T3 output: ``base``), never an absolute path or one leaving the folder that holds
them, so a moved or copied output still loads and a folder read back cannot point elsewhere.
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

from mmunlearn.adapters.base import HiddenStateTap
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.files.paths import check_entry, check_tree, plain_name
from mmunlearn.tilt.head import POOLINGS, TiltHead, pool_states
from mmunlearn.tilt.processor import TemperThenTilt, check_strength, seen_tokens, tilt_logprobs

CONFIG_NAME = "tilt_config.json"
HEAD_NAME = "tilt_head.safetensors"
#: Every setting a saved tilt may hold (anything else in a folder read back is refused, never passed on).
CONFIG_KEYS = frozenset({"temperature", "strength", "base_model", "head", "spare_seen"})


class TiltedCausalLM(nn.Module):
    """Frozen base LM + tilt head; the T3 distribution p^(1/T) f, renormalised. ``spare_seen``: a token already in
    the text (the prompt or the answer so far) is penalised no more than at even odds (log f floored at log 1/2,
    about what the head says of a token it never saw), so restating a name the question gives is not steered away
    from; scored and generated alike."""

    def __init__(
        self,
        base: nn.Module,
        head: TiltHead | None,
        temperature: float = 1.0,
        base_path: str | None = None,
        strength: float = 1.0,
        spare_seen: bool = False,
    ):
        super().__init__()
        if not temperature >= 1.0:
            raise ValueError(f"T3 tempers with T >= 1, got temperature={temperature}")
        self.base = base.eval()
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.head = head
        self.temperature = float(temperature)
        self.strength = check_strength(strength)
        self.spare_seen = bool(spare_seen)
        self.base_path = base_path
        self.tap = HiddenStateTap(base.base_model)
        self.config = base.config
        self.generation_config = base.generation_config

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> CausalLMOutputWithPast:
        if attention_mask is not None and "position_ids" not in kwargs and kwargs.get("past_key_values") is None:
            # positions as generate() numbers them, so left-padded rows score as they generate
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        if self.head is not None and kwargs.get("past_key_values") is not None:
            if self.head.pooling != "last":
                raise ValueError(
                    "a cummean tilt head needs every position's state: score whole sequences (generate "
                    "keeps its own running mean)"
                )
            if self.spare_seen:
                raise ValueError("a tilt sparing seen tokens needs the whole text: score whole sequences")
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        states = (
            self.tap.states if self.head is None else pool_states(self.tap.states, attention_mask, self.head.pooling)
        )
        seen = None
        if self.spare_seen and self.head is not None:
            seen = seen_tokens(input_ids, attention_mask, out.logits.shape[-1])
        logits = tilt_logprobs(out.logits, states, self.head, self.temperature, self.strength, seen)
        return CausalLMOutputWithPast(
            logits=logits, past_key_values=out.past_key_values, hidden_states=getattr(out, "hidden_states", None)
        )

    def generate(self, *args, **kwargs) -> torch.Tensor:
        """The base model's generate, tilted. Sampling uses temperature 1 and no top-k/top-p:
        the processor already tempers, and warping would change the T3 distribution."""
        for key, neutral in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)):
            if kwargs.get(key, neutral) != neutral:
                raise ValueError(f"{key}={kwargs[key]} would distort T3 sampling; set the temperature on the model")
            kwargs[key] = neutral
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        if self.head is not None and self.head.pooling != "last" and kwargs.get("num_beams", 1) != 1:
            raise ValueError(
                "beam search reorders rows; a cummean tilt head's running mean supports greedy decoding and sampling"
            )
        processors.append(
            TemperThenTilt(
                self.head,
                self.tap,
                self.temperature,
                self.strength,
                prompt_mask=kwargs.get("attention_mask"),
                spare_seen=self.spare_seen,
            )
        )
        return self.base.generate(*args, logits_processor=processors, **kwargs)

    def get_output_embeddings(self):
        return self.base.get_output_embeddings()

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Store the head and settings (not the base weights) in a new directory; ``base_path`` is recorded
        only as a plain folder name beside ``path`` (:func:`recorded_base`), else refused."""
        if self.base_path is not None:
            plain_name(self.base_path, f"the base model of {path} (a folder name beside it, not a path)")
        cfg = {
            "temperature": self.temperature,
            "strength": self.strength,
            "base_model": self.base_path,
            "head": None if self.head is None else self.head.config,
            **({"spare_seen": True} if self.spare_seen else {}),  # older tilts read as False
        }
        with atomic_dir(path, overwrite=overwrite) as tmp:
            (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2))
            if self.head is not None:
                save_file(
                    {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}, str(tmp / HEAD_NAME)
                )
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, base: nn.Module | None = None, device: str = "auto") -> TiltedCausalLM:
        """Load a saved tilt; the base model comes from ``base`` or the stored reference."""
        path = Path(path)
        check_tree(path)  # the head and its settings are files of tilt/ itself: no link leaving it
        cfg = read_config(path)
        _base_name(cfg, path)  # refused even when ``base`` is given: a folder read back never points elsewhere
        if base is None:
            recorded = recorded_base(path)
            if recorded is None:
                raise ValueError(f"{path} does not record its base model; pass base=")
            base = TextLLMAdapter.from_pretrained(recorded, device=device).model
        head = None
        if cfg.get("head"):
            head = TiltHead(**_head_sizes(cfg["head"], path))  # sizes checked; pooling one of POOLINGS
            state = load_file(str(path / HEAD_NAME))
            bad = sorted(k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
            if bad:
                raise ValueError(
                    f"{path / HEAD_NAME}: {', '.join(bad)} hold(s) NaN/Inf values: a damaged head would "
                    "tilt every answer into garbage"
                )
            head.load_state_dict(state)
            head.to(next(base.parameters()).device)
        return cls(
            base,
            head,
            cfg["temperature"],
            base_path=_base_name(cfg, path),
            strength=cfg.get("strength", 1.0),
            spare_seen=cfg.get("spare_seen", False),
        )


def read_config(path: str | os.PathLike) -> dict:
    """The settings in ``path``/tilt_config.json (FileNotFoundError / ValueError naming the file otherwise)."""
    file = Path(path) / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG_NAME}: not a saved tilted model")
    try:
        cfg = json.loads(file.read_text())
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{file} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{file} holds {type(cfg).__name__}, not the tilt's settings")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise ValueError(f"{file}: unknown setting(s) {unknown[:5]!r:.200} (a tilt has {sorted(CONFIG_KEYS)})")
    for key in ("temperature", "strength"):
        if key in cfg and (type(cfg[key]) not in (int, float) or cfg[key] != cfg[key]):
            raise ValueError(f"{file}: {key} must be a number, got {cfg[key]!r:.80}")
    if type(cfg.get("spare_seen", False)) is not bool:
        raise ValueError(f"{file}: spare_seen must be true or false, got {cfg['spare_seen']!r:.80}")
    return cfg


def _head_sizes(sizes: object, path: Path) -> dict[str, int]:
    """The head's ``hidden``, ``vocab`` and ``rank`` from ``tilt_config.json``, checked against the shapes in the
    head file's header before anything is allocated (a ``rank: 100000`` would ask for gigabytes)."""
    from safetensors import SafetensorError, safe_open

    file = path / CONFIG_NAME
    keys = ("hidden", "vocab", "rank")
    pooling = sizes.get("pooling", "last") if isinstance(sizes, dict) else None
    if (
        not isinstance(sizes, dict)
        or set(sizes) - {"pooling"} != set(keys)
        or not all(type(sizes[k]) is int for k in keys)
        or pooling not in POOLINGS
    ):
        raise ValueError(
            f"{file}: 'head' must hold the integers hidden, vocab and rank (and a pooling of "
            f"{POOLINGS}), got {sizes!r:.200}"
        )
    try:
        with safe_open(str(path / HEAD_NAME), framework="pt") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path / HEAD_NAME} is not a readable head file ({exc})") from None
    want = {
        "A.weight": [sizes["rank"], sizes["hidden"]],
        "B.weight": [sizes["vocab"], sizes["rank"]],
        "B.bias": [sizes["vocab"]],
    }
    if shapes != want or not 1 <= sizes["rank"] <= min(sizes["hidden"], sizes["vocab"]):
        raise ValueError(
            f"{file}: head sizes {sizes} do not match the tensors in {HEAD_NAME} ({shapes}) or rank is "
            "not between 1 and min(hidden, vocab)"
        )
    return {**{k: sizes[k] for k in keys}, "pooling": pooling}


def _base_name(cfg: dict, path: Path) -> str | None:
    """The ``base_model`` of a tilt's settings: None or a plain folder name (else UnsafePathError)."""
    name = cfg.get("base_model")
    return None if name is None else plain_name(name, path / CONFIG_NAME)


def recorded_base(path: str | os.PathLike) -> Path | None:
    """The base model folder a saved tilt ``path`` records (None when it records none): its ``base_model`` is a
    plain folder name beside ``path``; an absolute path, one with ``/`` or ``..``, or a link leaving the folder
    that holds ``path`` is refused (:class:`~mmunlearn.errors.UnsafePathError`)."""
    path = Path(path)
    name = _base_name(read_config(path), path)
    if name is None:
        return None
    folder = path.parent
    base = folder / name
    check_entry(base, folder)
    if not base.is_dir():
        raise FileNotFoundError(
            f"{path / CONFIG_NAME} names the base model folder {name!r}, but {base} is not a folder"
        )
    return base
