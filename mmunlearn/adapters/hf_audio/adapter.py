"""Adapter for Hugging Face audio classifiers whose labels are speakers (``AutoModelForAudioClassification``:
wav2vec2, HuBERT, WavLM, ...): a ``save_pretrained`` folder in, the same layout out.

The folder holds the model (``config.json`` with an audio-classification architecture, its ``id2label`` naming
the speakers, safetensors weights) and its feature extractor (``preprocessor_config.json``); :meth:`HFAudioAdapter.save`
writes both with ``save_pretrained``, so ``transformers.pipeline("audio-classification", model=OUT)`` runs an
unlearned folder as it ran the input.

Scores are the speaker classifiers' (:class:`~mmunlearn.adapters.speaker.batches.ClassifierScores`, shared with
:mod:`mmunlearn.adapters.speaker.adapter`): ``logits`` (B x C) are the model's, ``loss`` is their cross-entropy, each
utterance
a one-"token" sequence for ``logprobs`` / ``sequence_logprob``; ``embeddings`` are the pooled vectors the
classification head reads (what verification scores by cosine).
``layers()`` exposes the 2-D Linear weights (feature projection, each encoder layer's attention and feed-forward,
the projector and the classifier head), grouped as ``feature_projection``, ``encoder.layers.<i>``, ``projector``,
``classifier``; the convolutional feature encoder stays untouched.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mmunlearn.adapters.base import LayerWeight, resolve_device
from mmunlearn.adapters.hf_checks import check_hf_folder, check_loaded, check_preprocessor, loading
from mmunlearn.adapters.speaker.batches import SCOPES, ClassifierScores, labels_of, per_length
from mmunlearn.adapters.speaker.cache import EmbeddingCache, embedding_needs_grad
from mmunlearn.data.manifest import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from mmunlearn.data.waveforms import AudioCache, example_waveform
from mmunlearn.files.checkpoint import atomic_dir
from mmunlearn.kinds import Kind, read_small_json, register_kind

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: The module name of the class-weight Linear in the audio-classification heads this adapter reads.
_HEAD = "classifier"


def block_of(name: str) -> str:
    """Layer group of a parameter: ``encoder.layers.<i>`` for a transformer layer, else the module under the
    backbone (``feature_projection``, ``encoder``) or the head (``projector``, ``classifier``).

    >>> block_of("wav2vec2.encoder.layers.1.attention.q_proj.weight")
    'encoder.layers.1'
    >>> block_of("wav2vec2.feature_projection.projection.weight"), block_of("classifier.weight")
    ('feature_projection', 'classifier')
    """
    layer = _LAYER.search(name)
    if layer:
        return f"encoder.layers.{layer.group(1)}"
    parts = name.split(".")
    return parts[1] if len(parts) > 2 else parts[0]


class HFAudioAdapter(ClassifierScores):
    """An ``AutoModelForAudioClassification`` model with its feature extractor; class index -> speaker ID from
    ``config.id2label``. Batches (from :meth:`collate`): the extractor's features of each utterance alone
    (``input_values`` B x T padded with its padding value, or ``input_features``), ``attention_mask`` when the
    extractor asks for one, ``lengths`` B and ``labels`` B (-100 for an unknown speaker). A score never depends on
    the batch: a model without an attention mask runs each length on its own (:meth:`logits_and_embeddings`)."""

    def __init__(self, model: nn.Module, feature_extractor: Any, *, audio_cache: AudioCache | None = None):
        labels = model.config.id2label
        self.model = model
        self.feature_extractor = feature_extractor
        missing = [i for i in range(model.config.num_labels) if i not in labels]
        if missing:  # ids that skip a number: each class row needs its speaker
            where = getattr(model, "name_or_path", "") or "the model"
            raise ValueError(
                f"{where}: config.json's id2label names no speaker for class(es) {missing[:5]} of "
                f"{model.config.num_labels} (its keys must be 0..{model.config.num_labels - 1})"
            )
        self.speakers = [str(labels[i]) for i in range(model.config.num_labels)]
        if len(set(self.speakers)) != len(self.speakers):
            raise ValueError("the model's id2label names a speaker twice")
        self.index = {s: i for i, s in enumerate(self.speakers)}
        self.sample_rate = int(feature_extractor.sampling_rate)
        self.audio_cache = audio_cache if audio_cache is not None else AudioCache(1 << 30)
        if not isinstance(getattr(model, _HEAD, None), nn.Linear):
            raise ValueError(
                f"{type(model).__name__} has no Linear head named {_HEAD!r}: not an audio classifier this adapter knows"
            )
        self._scope = "all"
        #: pooled vectors kept while the weights below the head stay the same (on with the head scope, where an edit
        #: leaves them as they were: a sweep's points score only the head again; keyed by those weights' bytes,
        #: :mod:`mmunlearn.adapters.speaker.cache`)
        self.embedding_cache: EmbeddingCache | None = None

    @property
    def embedding_output(self) -> tuple[str, str | None] | None:
        """Weight and bias of the projector whose time-averaged outputs the head reads (wav2vec2, HuBERT, WavLM), or
        None for a model without one: what QR-Erase's centroid step edits (:mod:`mmunlearn.methods.embedding_step`)."""
        names = {n for n, _ in self.model.named_parameters()}
        if "projector.weight" not in names:
            return None
        return "projector.weight", "projector.bias" if "projector.bias" in names else None

    # ------------------------------------------------------------------ building, loading, saving
    @classmethod
    def build(
        cls,
        config: Any,
        speakers: Sequence[str],
        feature_extractor: Any,
        *,
        seed: int = 0,
        device: str | torch.device = "auto",
    ) -> HFAudioAdapter:
        """A fresh classifier from a transformers ``config`` (its labels set to ``speakers``), seeded by ``seed``
        without touching the global RNG."""
        from transformers import AutoModelForAudioClassification

        config.num_labels = len(speakers)
        config.id2label = {i: str(s) for i, s in enumerate(speakers)}
        config.label2id = {str(s): i for i, s in enumerate(speakers)}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForAudioClassification.from_config(config)
        return cls(model.to(resolve_device(device)).eval(), feature_extractor)

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | torch.device = "auto") -> HFAudioAdapter:
        """Read a ``save_pretrained`` folder: the model and its feature extractor (no code from the folder runs)."""
        from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

        if not Path(path).is_dir():
            raise FileNotFoundError(f"model directory not found: {path}")
        check_hf_folder(path)  # links, safetensors only, config.json sizes and kernels: before transformers reads it
        check_preprocessor(path)  # feature sizes (n_fft, hop, mel bins) in bounds: before the extractor is built
        fe = AutoFeatureExtractor.from_pretrained(str(path), trust_remote_code=False)
        rate = getattr(fe, "sampling_rate", None)  # sizes every resampled waveform: checked before the model loads
        if type(rate) not in (int, float) or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            raise ValueError(
                f"{Path(path) / 'preprocessor_config.json'}: sampling_rate {rate!r} is not an audio rate "
                f"({MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz)"
            )
        with loading(path):
            model = AutoModelForAudioClassification.from_pretrained(
                str(path), trust_remote_code=False, use_safetensors=True
            )
        check_loaded(model, path)
        return cls(model.to(resolve_device(device)).eval(), fe)

    from_pretrained = load

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """``save_pretrained`` of the model (safetensors) and the feature extractor into ``path``, atomically."""
        with atomic_dir(path, overwrite=overwrite) as tmp:
            self.model.save_pretrained(tmp)
            self.feature_extractor.save_pretrained(tmp)
        return Path(path)

    def with_model(self, model: nn.Module) -> HFAudioAdapter:
        """The same feature extractor and labels around another model; the decoded-audio cache is shared."""
        twin = HFAudioAdapter(model, self.feature_extractor, audio_cache=self.audio_cache)
        twin.scope = self.scope
        twin.embedding_cache = self.embedding_cache  # keyed by the weights' bytes: never stale for another model
        return twin

    def clone(self) -> HFAudioAdapter:
        """An independent copy of the model; feature extractor and audio cache are shared."""
        return self.with_model(copy.deepcopy(self.model))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ layers
    @property
    def scope(self) -> str:
        """Which weights :meth:`layers` exposes to task-vector extraction and erasure: ``all``, ``head`` (the class
        rows, :attr:`head_weight`: the speakers' names; every pooled vector stays bit for bit) or ``embedding``
        (everything below the head: what the pooled vectors are made of)."""
        return self._scope

    @scope.setter
    def scope(self, value: str) -> None:
        if value not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {value!r}")
        self._scope = value
        if value != "head":
            self.embedding_cache = None
        elif self.embedding_cache is None:
            self.embedding_cache = EmbeddingCache()

    @property
    def head_weight(self) -> str:
        """The parameter name of the class-weight matrix (one row per speaker): the sequence-classification heads
        of wav2vec2, HuBERT and WavLM all call their last Linear ``classifier``."""
        return f"{_HEAD}.weight"

    def layers(self) -> Iterator[LayerWeight]:
        """Every 2-D Linear weight (feature projection, encoder layers, projector, classifier), by :func:`block_of`;
        only those of :attr:`scope`."""
        for mname, module in self.model.named_modules():
            weight = getattr(module, "weight", None)
            if not (isinstance(module, nn.Linear) and isinstance(weight, nn.Parameter) and weight.dim() == 2):
                continue
            is_head = mname == _HEAD
            if (self.scope == "head" and not is_head) or (self.scope == "embedding" and is_head):
                continue
            name = f"{mname}.weight"
            yield LayerWeight(name, block_of(name), weight)

    def groups(self) -> dict[str, str]:
        """Parameter name -> block, for ``erase(..., groups=adapter.groups())``."""
        return {lw.name: lw.block for lw in self.layers()}

    # ------------------------------------------------------------------ batches
    def collate(self, examples: Sequence[Mapping[str, Any]], require_labels: bool = True) -> dict[str, torch.Tensor]:
        """The feature extractor's padded batch of examples (manifest rows, decoded via ``audio_cache``, or dicts
        whose ``wav`` is a 1-D waveform) with ``labels`` from ``spk_id``; an unknown or missing speaker is an error
        unless ``require_labels`` is False, then its label is -100."""
        if not examples:
            raise ValueError("cannot collate an empty list of examples")
        wavs = [example_waveform(ex, self.audio_cache, self.sample_rate).numpy() for ex in examples]
        labels = labels_of(examples, self.index, require_labels)
        name = self.feature_extractor.model_input_names[0]  # input_values (raw audio) or input_features
        feats = [self.feature_extractor(w, sampling_rate=self.sample_rate, return_tensors="pt")[name][0] for w in wavs]
        lengths = torch.tensor([f.shape[-1] for f in feats])
        batch = {
            name: torch.stack(feats)
            if len({tuple(f.shape) for f in feats}) == 1
            else _pad(feats, float(getattr(self.feature_extractor, "padding_value", 0.0)))
        }
        if getattr(self.feature_extractor, "return_attention_mask", False) and name == "input_values":
            batch["attention_mask"] = (torch.arange(int(lengths.max())) < lengths[:, None]).long()
        batch["lengths"] = lengths
        batch["labels"] = labels
        return batch

    # ------------------------------------------------------------------ scoring
    def logits_and_embeddings(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (B x C) and the pooled vectors the head reads (B x d): one pass, or without an attention mask
        one pass per utterance length, each cut to its length (:func:`per_length`), so that a model that reads
        padding (group-normalised wav2vec2) scores an utterance as it scores it alone."""
        net = model or self.model
        inputs = {k: v.to(self.device) for k, v in batch.items() if k not in ("labels", "lengths")}
        lengths = batch.get("lengths")
        if (
            self.embedding_cache is not None
            and net is self.model
            and not net.training
            and lengths is not None
            and "input_values" in inputs
            and not (torch.is_grad_enabled() and embedding_needs_grad(net))
        ):
            return self._cached(net, inputs, lengths)
        return self._uncached(net, inputs, lengths)

    def _uncached(
        self, net: nn.Module, inputs: Mapping[str, torch.Tensor], lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            "input_values" not in inputs
            or "attention_mask" in inputs
            or lengths is None
            or len(set(lengths.tolist())) == 1
        ):
            return self._pass(net, inputs)
        values = inputs["input_values"]
        return per_length(lengths, lambda idx, n: self._pass(net, {"input_values": values[idx.to(values.device), :n]}))

    def _cached(
        self, net: nn.Module, inputs: Mapping[str, torch.Tensor], lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`_uncached`, the pooled vectors taken from :attr:`embedding_cache` where it holds them (an
        utterance is keyed by its features cut to its length) and only the head run on them."""
        values = inputs["input_values"]

        def compute(missing: list[int]) -> torch.Tensor:
            idx = torch.tensor(missing, device=values.device)
            return self._uncached(net, {k: v[idx] for k, v in inputs.items()}, lengths[idx.cpu()])[1]

        pooled = self.embedding_cache.lookup(net, values, lengths.tolist(), compute)
        return net.classifier(pooled.to(net.classifier.weight.dtype)).float(), pooled

    @staticmethod
    def _pass(net: nn.Module, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        head = getattr(net, "module", net).classifier  # a training loop may pass a wrapped module
        seen: list[torch.Tensor] = []
        handle = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
        try:
            logits = net(**inputs).logits.float()
        finally:
            handle.remove()
        return logits, seen[0].float()

    def loss(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Mean cross-entropy of the batch (every label must be known)."""
        labels = batch["labels"]
        if (labels < 0).any():
            raise ValueError("loss needs a known speaker label for every example (found -100)")
        logits = self.logits(batch, model)
        return F.cross_entropy(logits, labels.to(logits.device))

    def hidden_states(self, batch: Mapping[str, torch.Tensor], layer: int | str = "final") -> torch.Tensor:
        """Frame-level states B x frames x d after encoder layer ``layer`` (0: the embedded features), or
        ``"final"``: the pooled vector as B x 1 x d."""
        if layer == "final":
            return self.embeddings(batch).unsqueeze(1)
        inputs = {k: v.to(self.device) for k, v in batch.items() if k not in ("labels", "lengths")}
        states = self.model(**inputs, output_hidden_states=True).hidden_states
        if not (isinstance(layer, int) and not isinstance(layer, bool) and -len(states) <= layer < len(states)):
            raise ValueError(f"layer must be 'final' or an int in [-{len(states)}, {len(states) - 1}], got {layer!r}")
        return states[layer]


def _pad(feats: Sequence[torch.Tensor], value: float) -> torch.Tensor:
    out = feats[0].new_full((len(feats), max(f.shape[-1] for f in feats)), value)
    for i, f in enumerate(feats):
        out[i, : f.shape[-1]] = f
    return out


def is_audio_classifier(folder: Path) -> bool:
    """A ``save_pretrained`` folder whose ``config.json`` names an ``AutoModelForAudioClassification`` architecture."""
    config = read_small_json(folder / "config.json")
    architectures = config.get("architectures") if config is not None else None
    if not isinstance(architectures, list) or not any(
        isinstance(a, str) and a.endswith("Classification") for a in architectures
    ):
        return False  # only then is transformers' table of architectures imported
    from transformers.models.auto.modeling_auto import MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES

    return any(a in set(MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES.values()) for a in architectures)


def _load_kind(folder: str | os.PathLike, *, device: str = "auto", scope: str = "all", **_: Any) -> HFAudioAdapter:
    adapter = HFAudioAdapter.load(folder, device=device)
    adapter.scope = scope
    return adapter


KIND = register_kind(
    Kind(
        "hf-audio",
        detect=is_audio_classifier,
        load=_load_kind,
        adapter=HFAudioAdapter,
        sizes=("tiny", "small", "large"),
        default_size="small",
        description="Hugging Face audio classifier in save_pretrained layout (AutoModelForAudioClassification: "
        "wav2vec2, HuBERT, WavLM)",
        presets_from="speaker",
        train_in_eval_mode=True,
        is_classifier=True,
        takes_audio=True,
        priority=20,
        trainer="mmunlearn.adapters.hf_audio.training",
    )
)
