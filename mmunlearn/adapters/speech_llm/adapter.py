"""Adapter for speech LLMs (Qwen2-Audio, Qwen2.5-Omni thinker, Qwen3-Omni MoE thinker): spoken QA in, scores out.

An example is a dict with the audio (``wav``: a file path with optional ``start``/``stop`` sample
indices at 16 kHz, as in a manifest row, or a 1-D waveform), a ``question`` and an ``answer``.
Its model inputs are built as the family's processor builds them: Whisper log-mel features padded
to the extractor's window (``input_features``, ``feature_attention_mask`` marking the clip's frames;
Omni batches keep only the longest clip's frames, which the encoder selects by the mask anyway),
and the chat template rendered with one audio item whose placeholder token is repeated as many
times as the encoder outputs for the clip. Prompt and answer are tokenised separately; the labels
cover exactly the answer tokens plus the family's end-of-turn token (ChatML ``<|im_end|>``).

``layers()`` exposes the audio tower (and Qwen2-Audio's projector) and the language model, grouped
as ``audio.layers.<i>`` / ``audio.conv`` / ``audio.proj`` / ``text.layers.<i>``; ``where`` (``audio``,
``text``, ``both``) limits what task vectors, erasure and the baselines see.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jinja2 import TemplateError
from torch import nn
from tqdm.auto import tqdm

from mmunlearn.adapters.base import IGNORE, HiddenStateTap, LayerWeight, TokenScoring
from mmunlearn.adapters.speech_llm.build import arch_for, build_feature_extractor, build_model, build_tokenizer
from mmunlearn.adapters.speech_llm.families import FAMILIES, WHERE, Family, family_of, tower_block, tower_of
from mmunlearn.adapters.speech_llm.io import load_dir, save_dir
from mmunlearn.adapters.text.adapter import _qa
from mmunlearn.adapters.text.chat_template import install as install_bounds
from mmunlearn.adapters.text.chat_template import template_error
from mmunlearn.data.waveforms import AudioCache, example_waveform
from mmunlearn.kinds import Kind, read_small_json, register_kind

SAMPLE_RATE = 16000
END_OF_TURN = "<|im_end|>"  # the ChatML end of turn; each family names its own (Family.turn_end)


def check_where(where: str) -> str:
    if where not in WHERE:
        raise ValueError(f"where must be one of {WHERE}, got {where!r}")
    return where


class SpeechLLMAdapter(TokenScoring):
    """A speech LLM with its tokenizer, feature extractor and chat template, behind the adapter interface.

    ``container``: the full model (thinker + talker) when the directory held one; edits to
    ``model`` (its thinker) are saved through it, so the directory keeps its format.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        feature_extractor,
        *,
        family: str | Family | None = None,
        where: str = "both",
        system: str | None = None,
        chat_template: str | None = None,
        max_length: int = 4096,
        container: nn.Module | None = None,
        processor=None,
        audio_cache: AudioCache | None = None,
        feature_cache_bytes: int = 1 << 30,
    ):
        self.model, self.tokenizer, self.feature_extractor = model, tokenizer, feature_extractor
        self.family = (
            FAMILIES[family]
            if isinstance(family, str)
            else family
            or family_of(
                model.config.model_type, getattr(getattr(model.config, "text_config", None), "model_type", None)
            )[0]
        )
        self.where = check_where(where)
        self.system, self.max_length = system, int(max_length)
        self.container, self.processor = container, processor
        self.chat_template = (
            chat_template
            or getattr(processor, "chat_template", None)
            or getattr(tokenizer, "chat_template", None)
            or self.family.chat_template
        )
        if getattr(feature_extractor, "sampling_rate", SAMPLE_RATE) != SAMPLE_RATE:
            raise ValueError(f"feature extractor samples at {feature_extractor.sampling_rate} Hz; manifests are 16 kHz")
        self.audio_id = tokenizer.convert_tokens_to_ids(self.family.audio_token)
        if self.audio_id is None or self.audio_id == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no audio placeholder token {self.family.audio_token!r}")
        end = tokenizer.convert_tokens_to_ids(self.family.turn_end)
        self.end_id = end if end is not None and end != tokenizer.unk_token_id else tokenizer.eos_token_id
        if self.end_id is None:
            raise ValueError(f"tokenizer has neither {self.family.turn_end!r} nor an EOS token")
        self.stop_ids = sorted({i for i in (self.end_id, tokenizer.eos_token_id) if i is not None})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id
        self.audio_cache = audio_cache if audio_cache is not None else AudioCache(1 << 30)
        self._features: dict[tuple, tuple[torch.Tensor, int]] = {}
        self._feature_budget, self._feature_bytes = int(feature_cache_bytes), 0
        self._prompts: dict[str, list[int]] = {}
        self.source_dir: Path | None = None
        self.arch = None  # the SpeechArch of a model built here

    # ------------------------------------------------------------------ building, loading, saving
    @classmethod
    def build(
        cls,
        preset: str = "tiny",
        *,
        texts: Sequence[str],
        family: str | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        where: str = "both",
        **arch_overrides: Any,
    ) -> SpeechLLMAdapter:
        """A random-init model of a size preset (``tiny``, ``mini``; see :mod:`speech_llm_build`) with a BPE
        trained on ``texts`` (the questions and answers it will see) and a matching feature extractor."""
        arch = arch_for(preset, family, **arch_overrides)
        fam = FAMILIES[arch.family]
        tok = build_tokenizer(fam, texts, arch.vocab_size)
        model = build_model(arch, tok, seed).to(device)
        adapter = cls(model, tok, build_feature_extractor(arch), family=fam, where=where)
        adapter.arch = arch
        return adapter

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str = "auto", dtype: str | torch.dtype = "auto", **kwargs: Any
    ) -> SpeechLLMAdapter:
        """Load a ``save_pretrained`` directory (thinker-only or full Omni model) with its processor."""
        model, container, tokenizer, fe, processor, fam = load_dir(path, device=device, dtype=dtype)
        adapter = cls(model, tokenizer, fe, family=fam, container=container, processor=processor, **kwargs)
        adapter.source_dir = Path(path)  # side files (e.g. spk_dict.pt) are carried over by save()
        return adapter

    load = from_pretrained

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Model (the full container if loaded from one), tokenizer, feature extractor (and processor), atomically."""
        return save_dir(self, path, overwrite=overwrite)

    def with_model(self, model: nn.Module) -> SpeechLLMAdapter:
        """The same adapter around another model (e.g. a tilted wrapper); caches are shared."""
        twin = copy.copy(self)
        twin.model = model
        return twin

    def clone(self) -> SpeechLLMAdapter:
        """An independent copy of the model (container included); tokenizer and caches are shared."""
        if self.container is None:
            return self.with_model(copy.deepcopy(self.model))
        container = copy.deepcopy(self.container)
        twin = self.with_model(container.thinker)
        twin.container = container
        return twin

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ layers
    def layers(
        self, where: str | None = None, include_embeddings: bool = False, include_lm_head: bool = False
    ) -> Iterator[LayerWeight]:
        """Linear weights, Conv1d kernels (3-D) and fused expert tensors (3-D, one matrix per expert for
        erasure) of the audio tower and the language model's blocks; vision tower never."""
        where = check_where(where or self.where)
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        seen: set[int] = set()
        for mname, module in self.model.named_modules():
            if isinstance(module, nn.Embedding):
                params = [("weight", module.weight)] if include_embeddings else []
            elif isinstance(module, (nn.Linear, nn.Conv1d)):
                params = [("weight", module.weight)]
            elif isinstance(module, (nn.Conv2d, nn.Conv3d)):
                params = []  # Conv2d kernels (Qwen3-Omni's mel downsampler) have no matrix view
            else:
                params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.dim() in (2, 3)]
            for pname, p in params:
                name = f"{mname}.{pname}" if mname else pname
                block = tower_block(name)
                if block is None or id(p) in seen or (where != "both" and tower_of(block) != where):
                    continue
                if module is head and not include_lm_head:
                    continue
                if (
                    block.startswith("text.")
                    and not block.startswith("text.layers.")
                    and not (module is head or isinstance(module, nn.Embedding))
                ):
                    continue
                seen.add(id(p))
                yield LayerWeight(name, block, p)

    def trainable_parameters(self) -> list[nn.Parameter] | None:
        """With ``where`` audio or text: every parameter of that tower (biases and norms included; the vision tower
        and talker never), so the training methods keep to it as erasure does; with ``both``: None (all)."""
        if self.where == "both":
            return None
        return [
            p
            for name, p in self.model.named_parameters()
            if (block := tower_block(name)) is not None and tower_of(block) == self.where
        ]

    def groups(self, where: str | None = None) -> dict[str, str]:
        """Parameter name -> layer group, for ``erase(..., groups=...)`` (the towers stay apart)."""
        return {lw.name: lw.block for lw in self.layers(where)}

    # ------------------------------------------------------------------ inputs
    def audio_tokens(self, frames: int) -> int:
        """Placeholder tokens for a clip of ``frames`` valid mel frames."""
        audio_cfg = getattr(self.model.config, "audio_config", None)
        return self.family.audio_tokens(frames, getattr(audio_cfg, "n_window", None))

    def features(self, example: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
        """(log-mel features mel x frames, valid frames) of an example's audio, as the processor computes
        them (zero-padded to the extractor's window, ``max_length`` padding); Omni families keep only the
        valid frames. Cached per file segment."""
        wav = example.get("wav") if isinstance(example, Mapping) else None
        key = (str(wav), example.get("start"), example.get("stop")) if isinstance(wav, (str, os.PathLike)) else None
        if key is not None and key in self._features:
            return self._features[key]
        audio = example_waveform(example, self.audio_cache, SAMPLE_RATE)
        out = self.feature_extractor(
            [audio.numpy()],
            sampling_rate=SAMPLE_RATE,
            padding="max_length",
            truncation=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        valid = int(out["attention_mask"][0].sum())
        feats = out["input_features"][0]
        feats = feats.clone() if self.family.pad_to_window else feats[:, :valid].clone()
        if key is not None and self._feature_bytes + feats.numel() * 4 <= self._feature_budget:
            self._features[key] = (feats, valid)
            self._feature_bytes += feats.numel() * 4
        return feats, valid

    def _prompt_ids(self, question: str) -> list[int]:
        """Token ids of the rendered chat prompt with one audio placeholder (cached per question)."""
        if question not in self._prompts:
            messages = [{"role": "system", "content": self.system}] if self.system else []
            messages.append(
                {"role": "user", "content": [{"type": "audio", "audio": "clip"}, {"type": "text", "text": question}]}
            )
            install_bounds()  # the folder's chat template is someone else's code: rendered within bounds
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
                )
            except (TemplateError, OverflowError) as exc:  # OverflowError: Jinja's "range too big"
                raise template_error(exc, getattr(self.tokenizer, "name_or_path", "the tokenizer")) from None
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if ids.count(self.audio_id) != 1:
                raise ValueError(
                    f"the chat template rendered {ids.count(self.audio_id)} audio placeholders "
                    f"({self.family.audio_token!r}) for one audio item; expected 1"
                )
            self._prompts[question] = ids
        return self._prompts[question]

    def encode(self, question: str, n_audio: int, answer: str | None = None) -> tuple[list[int], list[int]]:
        """(ids, labels): the prompt with ``n_audio`` placeholders, then answer + end of turn (labelled)."""
        prompt = self._prompt_ids(question)
        at = prompt.index(self.audio_id)
        ids = prompt[:at] + [self.audio_id] * n_audio + prompt[at + 1 :]
        labels = [IGNORE] * len(ids)
        if answer is not None:
            ans = self.tokenizer(answer, add_special_tokens=False)["input_ids"] + [self.end_id]
            ids, labels = ids + ans, labels + ans
        if len(ids) > self.max_length:
            raise ValueError(f"example of {len(ids)} tokens ({n_audio} audio) exceeds max_length={self.max_length}")
        return ids, labels

    def collate(
        self,
        examples: Sequence[Any],
        answers: Sequence[str] | None = None,
        *,
        left_pad: bool = False,
        with_answers: bool = True,
    ) -> dict[str, torch.Tensor]:
        """A padded batch: ``input_ids``, ``attention_mask``, ``labels``, ``input_features``,
        ``feature_attention_mask``. ``answers`` overrides the examples' answers; ``with_answers=False``
        builds prompts only (left-padded with ``left_pad`` for generation)."""
        if not examples:
            raise ValueError("cannot collate an empty list of examples")
        rows, feats = [], []
        for i, ex in enumerate(examples):
            q, a = _qa(ex)
            a = answers[i] if answers is not None else a
            if with_answers and not isinstance(a, str):
                raise ValueError(f"example {i} has no answer to score")
            f, valid = self.features(ex)
            feats.append((f, valid))
            rows.append(self.encode(q, self.audio_tokens(valid), a if with_answers else None))
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, lab) in enumerate(rows):
            span = slice(width - len(ids), width) if left_pad else slice(0, len(ids))
            input_ids[i, span], labels[i, span], mask[i, span] = torch.tensor(ids), torch.tensor(lab), 1
        frames = max(f.shape[1] for f, _ in feats)
        input_features = torch.zeros(len(feats), feats[0][0].shape[0], frames)
        feature_mask = torch.zeros(len(feats), frames, dtype=torch.long)
        for i, (f, valid) in enumerate(feats):
            input_features[i, :, : f.shape[1]] = f
            feature_mask[i, :valid] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "labels": labels,
            "input_features": input_features,
            "feature_attention_mask": feature_mask,
        }

    def prompt_batch(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Left-padded prompts (audio + question) for generation, without labels."""
        batch = self.collate(examples, left_pad=True, with_answers=False)
        batch.pop("labels")
        return batch

    def model_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch minus labels, on the model's device, features in the model's dtype."""
        dtype = next(self.model.parameters()).dtype
        return {
            k: (v.to(self.device, dtype) if k == "input_features" else v.to(self.device))
            for k, v in batch.items()
            if k != "labels"
        }

    # ------------------------------------------------------------------ scoring
    def logits(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token logits aligned with their targets: (B x T-1 x V, targets B x T-1)."""
        out = (model or self.model)(**self.model_inputs(batch))
        return out.logits[:, :-1].float(), batch["labels"][:, 1:].to(out.logits.device)

    def target_distributions(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Log-probabilities over the vocabulary at every answer position (N x V), for KL terms."""
        logits, targets = self.logits(batch, model)
        return torch.log_softmax(logits[targets != IGNORE], -1)

    def audio_embeddings(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> list[torch.Tensor]:
        """What replaces each clip's placeholders: the audio tower's (projected) outputs, one n_i x d tensor per
        clip (differentiable). Qwen2-Audio's tower runs unmasked over the padded window; the first n_i outputs
        of each clip are kept."""
        inputs = self.model_inputs(batch)
        counts = [self.audio_tokens(int(v)) for v in batch["feature_attention_mask"].sum(1)]
        inner = (model or self.model).model
        if hasattr(inner, "get_audio_features"):
            out = inner.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"])
            return list(out.last_hidden_state.split(counts))
        out = inner.multi_modal_projector(inner.audio_tower(inputs["input_features"]).last_hidden_state)
        return [out[i, :n] for i, n in enumerate(counts)]

    @torch.no_grad()
    def hidden_states(self, batch: Mapping[str, torch.Tensor], layer: int | str = "final") -> torch.Tensor:
        """Language-model hidden states B x T x d: ``final`` = the last normed state (what the LM head and
        T3's tilt head read), an int indexes the decoder's per-layer outputs."""
        if layer == "final":
            tap = HiddenStateTap(self.model.base_model)
            try:
                self.model(**self.model_inputs(batch))
            finally:
                tap.remove()
            return tap.states
        states = self.model(**self.model_inputs(batch), output_hidden_states=True).hidden_states
        if not isinstance(layer, int) or isinstance(layer, bool) or not -len(states) <= layer < len(states):
            raise ValueError(f"layer must be 'final' or an int in [-{len(states)}, {len(states) - 1}], got {layer!r}")
        return states[layer]

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        examples: Sequence[Any],
        max_new_tokens: int = 16,
        batch_size: int = 16,
        desc: str | None = None,
        **gen_kwargs: Any,
    ) -> list[str]:
        """Batched greedy answers to the examples' questions about their audio (new text only)."""
        texts: list[str] = []
        kwargs = {"do_sample": False, **gen_kwargs}
        for i in tqdm(range(0, len(examples), batch_size), desc=desc, disable=desc is None, leave=False):
            b = self.model_inputs(self.prompt_batch(examples[i : i + batch_size]))
            out = self.model.generate(
                **b, max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.stop_ids, **kwargs
            )
            seqs = out.sequences if hasattr(out, "sequences") else out
            new = seqs[:, b["input_ids"].shape[1] :]
            texts.extend(t.strip() for t in self.tokenizer.batch_decode(new, skip_special_tokens=True))
        return texts


def _is_speech_llm(folder: Path) -> bool:
    config = read_small_json(folder / "config.json")
    return config is not None and any(
        config.get("model_type") in (*f.model_types, *f.full_model_types) for f in FAMILIES.values()
    )


def _load_kind(
    folder: str | os.PathLike, *, device: str = "auto", where: str = "both", scope: str = "all", **_: Any
) -> SpeechLLMAdapter:
    if scope != "all":
        raise ValueError(
            f"scope={scope!r} applies to speaker classifiers; {folder} is a speech LLM "
            f"(choose its weights with where=audio|text|both)"
        )
    return SpeechLLMAdapter.load(folder, device=device, where=where)


KIND = register_kind(
    Kind(
        "speech-llm",
        detect=_is_speech_llm,
        load=_load_kind,
        adapter=SpeechLLMAdapter,
        sizes=("tiny", "mini", "model_dir"),
        default_size="model_dir",
        description=f"speech LLM in save_pretrained layout ({', '.join(FAMILIES)})",
        takes_audio=True,
        priority=30,
    )
)
