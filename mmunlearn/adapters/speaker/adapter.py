"""Adapter for speaker classifiers: SpeechBrain ECAPA-TDNN embeddings + cosine Classifier head, Fbank features.

Built from a size preset (:meth:`SpeakerAdapter.build`) or read from a directory in SpeechBrain's
pretrained ``EncoderClassifier`` layout (:meth:`SpeakerAdapter.load`, see
:mod:`mmunlearn.adapters.speaker.io`), e.g. a local copy of speechbrain/spkrec-ecapa-voxceleb.

Scores, for one utterance x with speaker class y, cosine similarities c_k = cos(emb(x), w_k) and the
AAM scale s:

* ``loss`` is the training loss, AAM-softmax (additive angular margin m; Deng et al., 2019,
  "ArcFace", arXiv:1801.07698): mean of -log softmax(s * [cos(theta_y + m), c_k (k != y)])_y.
* ``logits`` are s * c (no margin); the unlearning methods' per-example log-likelihood
  (``logprobs``, ``sequence_logprob``; each utterance is a one-"token" sequence), the class
  distribution (``target_distributions``, N x C) and the loss attack of the membership-inference
  metric all use log softmax(s * c). The margin only shapes training; at test time it would merely
  shift the target logit.

>>> import torch
>>> adapter = SpeakerAdapter.build(["spk_a", "spk_b", "spk_c"], preset="tiny", device="cpu")
>>> batch = adapter.collate([{"wav": torch.randn(8000), "spk_id": "spk_b"},
...                          {"wav": torch.randn(6000), "spk_id": "spk_a"}])
>>> batch["wavs"].shape, batch["wav_lens"].tolist(), batch["labels"].tolist()
(torch.Size([2, 8000]), [1.0, 0.75], [1, 0])
>>> adapter.logits(batch).shape, adapter.embeddings(batch).shape
(torch.Size([2, 3]), torch.Size([2, 16]))
>>> adapter.hidden_states(batch, 0).shape  # frames x channels of the first TDNN block
torch.Size([2, 51, 16])
>>> adapter.target_distributions(batch).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmunlearn.adapters.base import IGNORE, LayerWeight, resolve_device  # noqa: F401  (IGNORE: re-exported)
from mmunlearn.adapters.speaker.batches import (  # noqa: F401
    SCOPES,
    SCORING_VERSION,
    ClassifierScores,
    by_length,
    labels_of,
    length_groups,
    repeat_pad,
    sample_counts,  # SCORING_VERSION, repeat_pad: re-exported
)
from mmunlearn.adapters.speaker.cache import EmbeddingCache, embedding_needs_grad
from mmunlearn.adapters.speaker.io import (
    CLASSIFIER_CKPT,
    EMBEDDING_CKPT,
    HPARAMS,
    check_hparams_tags,
    parse_hparams,
    read_speaker_dir,
    read_state,
    write_speaker_dir,
    write_state,
)
from mmunlearn.adapters.speaker.model import SpeakerConfig, SpeakerNet, SpeakerSpec, build_net
from mmunlearn.adapters.speaker.write_hparams import hparams_yaml
from mmunlearn.data.waveforms import AudioCache, example_waveform
from mmunlearn.kinds import Kind, register_kind


def block_of(name: str) -> str:
    """Layer group of a parameter: one ECAPA block (``embedding_model.blocks.<i>``, ``.mfa``, ``.asp``,
    ``.fc``) or the ``classifier``.

    >>> block_of("embedding_model.blocks.2.res2net_block.blocks.0.conv.conv.weight")
    'embedding_model.blocks.2'
    >>> block_of("embedding_model.asp.tdnn.conv.conv.weight"), block_of("classifier.weight")
    ('embedding_model.asp', 'classifier')
    """
    parts = name.split(".")
    if parts[0] == "embedding_model" and len(parts) > 2:
        if parts[1] == "blocks" and parts[2].isdigit():
            return ".".join(parts[:3])
        return ".".join(parts[:2])
    return parts[0]


class SpeakerAdapter(ClassifierScores):
    """A :class:`SpeakerNet` with its speaker IDs (class index -> ID) and the modality-adapter interface
    (:class:`~mmunlearn.adapters.base.ModalityAdapter`; the per-utterance scores from :class:`ClassifierScores`).

    Batches (from :meth:`collate`): ``wavs`` B x T (zero-padded, 16 kHz), ``wav_lens`` B (relative
    lengths, 1.0 = T) and ``labels`` B (class indices, -100 for an unknown speaker). In train mode
    ECAPA's BatchNorm after pooling needs batches of two or more utterances.
    """

    #: Weight and bias of the layer whose outputs are the embeddings (ECAPA's last 1x1 convolution): what QR-Erase's
    #: centroid step edits (:mod:`mmunlearn.methods.embedding_step`).
    embedding_output: tuple[str, str | None] = ("embedding_model.fc.conv.weight", "embedding_model.fc.conv.bias")

    def __init__(
        self,
        model: SpeakerNet,
        speakers: Sequence[str],
        *,
        margin: float,
        scale: float,
        spec: SpeakerSpec | None = None,
        sample_rate: int = 16000,
        audio_cache: AudioCache | None = None,
        spec_error: str | None = None,
    ):
        if len(speakers) != model.n_classes:
            raise ValueError(f"{len(speakers)} speaker IDs for a classifier of {model.n_classes} classes")
        if len(set(speakers)) != len(speakers):
            raise ValueError("speaker IDs must be unique")
        from speechbrain.nnet.losses import AdditiveAngularMargin, LogSoftmaxWrapper

        self.model = model
        self.speakers = [str(s) for s in speakers]
        self.index = {s: i for i, s in enumerate(self.speakers)}
        self.margin, self.scale, self.sample_rate = float(margin), float(scale), int(sample_rate)
        # What save() writes hyperparams.yaml from; None (with spec_error saying why) only for a
        # trusted load of modules mmunlearn cannot describe, or an adapter built around a bare SpeakerNet.
        self.spec = spec
        self.spec_error = spec_error
        self.config: SpeakerConfig | None = None  # set by build(); None for a loaded directory
        self.audio_cache = audio_cache if audio_cache is not None else AudioCache(1 << 30)
        self._aam = LogSoftmaxWrapper(AdditiveAngularMargin(margin=self.margin, scale=self.scale))
        self._scope = "all"
        #: Embeddings reused while the embedding model is unchanged (on in the ``head`` scope, where edits
        #: leave it alone); see :mod:`mmunlearn.adapters.speaker.cache`.
        self.embedding_cache: EmbeddingCache | None = None

    # ------------------------------------------------------------------ building, loading, saving
    @classmethod
    def build(
        cls,
        n_speakers: int | Sequence[str],
        preset: str = "small",
        *,
        seed: int = 0,
        device: str | torch.device = "auto",
        **overrides: Any,
    ) -> SpeakerAdapter:
        """A fresh model for ``n_speakers`` classes (or these speaker IDs, in this class order).

        ``preset``: a size in :data:`~mmunlearn.adapters.speaker.model.PRESETS`; ``overrides``:
        any :class:`SpeakerConfig` field (``channels``, ``lin_neurons``, ``margin``, ``scale``, ...).
        Initialisation is seeded by ``seed`` without touching the global RNG.
        """
        speakers = [str(i) for i in range(n_speakers)] if isinstance(n_speakers, int) else [str(s) for s in n_speakers]
        config = SpeakerConfig.from_preset(len(speakers), preset, **overrides)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = build_net(config)
        adapter = cls(
            net.to(resolve_device(device)).eval(),
            speakers,
            margin=config.margin,
            scale=config.scale,
            spec=config.spec(),
            sample_rate=config.sample_rate,
        )
        adapter.config = config
        return adapter

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, device: str | torch.device = "auto", trust_hparams: bool = False
    ) -> SpeakerAdapter:
        """Read a SpeechBrain-layout directory (written by :meth:`save` or SpeechBrain's own).

        Safe by default: ``hyperparams.yaml`` is parsed as data and may only name the allow-listed
        SpeechBrain classes; checkpoints are read with ``torch.load(weights_only=True)`` (see
        :mod:`mmunlearn.adapters.speaker.io`). ``trust_hparams=True`` instantiates the YAML with
        HyperPyYAML as SpeechBrain does, which **runs the code the file names**: only for trusted folders.
        """
        found = read_speaker_dir(path, trust_hparams=trust_hparams)
        return cls(
            found.net.to(resolve_device(device)).eval(),
            found.speakers,
            margin=found.margin,
            scale=found.scale,
            spec=found.spec,
            sample_rate=found.sample_rate,
            spec_error=found.spec_error,
        )

    from_pretrained = load

    @property
    def hparams_text(self) -> str:
        """The hyperparams.yaml :meth:`save` writes (generated from :attr:`spec`, never an input's text)."""
        return hparams_yaml(self._spec_for_saving())

    def _spec_for_saving(self) -> SpeakerSpec:
        if self.spec is None:
            why = f": {self.spec_error}" if self.spec_error else ""
            raise ValueError(
                "this speaker model has no SpeakerSpec to write hyperparams.yaml from (built around "
                f"a bare SpeakerNet, or loaded with trust_hparams=True from modules mmunlearn cannot "
                f"describe{why})"
            )
        if (self.spec.margin, self.spec.scale, self.spec.sample_rate) != (self.margin, self.scale, self.sample_rate):
            return dataclasses.replace(self.spec, margin=self.margin, scale=self.scale, sample_rate=self.sample_rate)
        return self.spec

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write hyperparams.yaml (generated), embedding_model.ckpt, classifier.ckpt and label_encoder.ckpt,
        atomically."""
        return write_speaker_dir(path, self.model, self.speakers, self._spec_for_saving(), overwrite=overwrite)

    def with_model(self, model: nn.Module) -> SpeakerAdapter:
        """The same speakers, settings and scope around another model; the decoded-audio and embedding caches are
        shared (the embedding cache is keyed by the weights' bytes)."""
        twin = SpeakerAdapter(
            model,
            self.speakers,
            margin=self.margin,
            scale=self.scale,
            spec=self.spec,
            sample_rate=self.sample_rate,
            audio_cache=self.audio_cache,
            spec_error=self.spec_error,
        )
        twin.config, twin.scope = self.config, self.scope
        twin.embedding_cache = self.embedding_cache
        return twin

    def clone(self) -> SpeakerAdapter:
        """An independent copy of the model (e.g. to unlearn while keeping the original); the caches are shared."""
        return self.with_model(copy.deepcopy(self.model))

    @property
    def scope(self) -> str:
        """Which weights :meth:`layers` exposes to task-vector extraction and erasure: ``all``, ``head`` (the
        cosine classifier's class weights: the speakers' names; embeddings, hence verification, stay bit for
        bit) or ``embedding`` (the ECAPA embedding model: what verification scores)."""
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
        """The parameter name of the cosine classifier's class-weight matrix (one row per speaker)."""
        return "classifier.weight"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ layers
    def layers(self, include_classifier: bool = True) -> Iterator[LayerWeight]:
        """Every Conv1d kernel (3-D, out x in x k; erasure views it as out x in*k) and Linear weight of the
        embedding model, and the classifier's class-weight matrix, grouped by :func:`block_of`; only those of
        :attr:`scope` (what task vectors are extracted from and erasure edits)."""
        for mname, module in self.model.named_modules():
            is_head = module is self.model.classifier
            if not (isinstance(module, (nn.Conv1d, nn.Linear)) or is_head) or (is_head and not include_classifier):
                continue
            if (self.scope == "head" and not is_head) or (self.scope == "embedding" and is_head):
                continue
            weight = getattr(module, "weight", None)
            if isinstance(weight, nn.Parameter) and weight.dim() in (2, 3):
                name = f"{mname}.weight"
                yield LayerWeight(name, block_of(name), weight)

    def groups(self, include_classifier: bool = True) -> dict[str, str]:
        """Parameter name -> block, for ``erase(..., groups=adapter.groups())`` (its default grouping
        by the first numeric name part would split MFA/ASP/fc into sub-module groups)."""
        return {lw.name: lw.block for lw in self.layers(include_classifier)}

    # ------------------------------------------------------------------ batches
    def collate(self, examples: Sequence[Mapping[str, Any]], require_labels: bool = True) -> dict[str, torch.Tensor]:
        """Zero-padded batch of examples: manifest rows (decoded, via ``audio_cache``) or dicts whose
        ``wav`` is a 1-D waveform. ``spk_id`` gives the label; an unknown (or missing) speaker is an
        error unless ``require_labels`` is False, then its label is -100."""
        if not examples:
            raise ValueError("cannot collate an empty list of examples")
        wavs = [example_waveform(ex, self.audio_cache, self.sample_rate) for ex in examples]
        labels = labels_of(examples, self.index, require_labels)
        width = max(w.numel() for w in wavs)
        batch = torch.zeros(len(wavs), width)
        for i, w in enumerate(wavs):
            batch[i, : w.numel()] = w
        lens = torch.tensor([w.numel() / width for w in wavs], dtype=torch.float32)
        return {"wavs": batch, "wav_lens": lens, "labels": labels}

    def _to(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    # ------------------------------------------------------------------ scoring
    # Every scoring method takes an optional ``model``: a training loop passes its (possibly
    # distributed-wrapped) module so gradients flow through the wrapper.
    def _forward(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None) -> tuple[torch.Tensor, ...]:
        b = self._to(batch)
        net = model or self.model
        if net.training:  # BatchNorm learns from the batch: one pass, padding filled with each utterance's own audio
            cosine, emb = net(repeat_pad(b["wavs"], b["wav_lens"]), torch.ones_like(b["wav_lens"]))
        elif (
            self.embedding_cache is not None
            and net is self.model
            and not (torch.is_grad_enabled() and embedding_needs_grad(net))
        ):  # e.g. a head-only gradient: cached
            cosine, emb = self._cached(net, b["wavs"], b["wav_lens"])
        else:
            cosine, emb = by_length(net, b["wavs"], b["wav_lens"])
        return cosine.float(), emb, b["labels"]

    def _cached(self, net: SpeakerNet, wavs: torch.Tensor, wav_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :func:`by_length`, the embeddings taken from :attr:`embedding_cache` where it holds them."""
        samples = sample_counts(wav_lens, wavs.shape[1]).tolist()

        def compute(missing: list[int]) -> torch.Tensor:
            idx = torch.tensor(missing, device=wavs.device)
            return by_length(net, wavs[idx], wav_lens[idx])[1]

        emb = self.embedding_cache.lookup(net, wavs, samples, compute)
        return net.classifier(emb.unsqueeze(1)).squeeze(1), emb

    def logits_and_embeddings(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits ``scale * cosine`` (B x C) and the speaker embeddings (B x d, the x-vectors verification scores
        by cosine similarity), from one forward pass."""
        cosine, emb, _ = self._forward(batch, model)
        return self.scale * cosine, emb

    def cosine(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Cosine similarity of each embedding to each class weight, B x C in [-1, 1]."""
        return self._forward(batch, model)[0]

    def loss(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Mean AAM-softmax loss of the batch (the training loss; every label must be known)."""
        cosine, _, labels = self._forward(batch, model)
        if (labels < 0).any():
            raise ValueError("loss needs a known speaker label for every example (found -100)")
        return self._aam(cosine.unsqueeze(1), labels.unsqueeze(1))

    def hidden_states(self, batch: Mapping[str, torch.Tensor], layer: int | str = "final") -> torch.Tensor:
        """Frame-level outputs B x frames x channels of ECAPA block ``layer`` (an int indexes
        ``embedding_model.blocks``, ``"mfa"`` the aggregation layer), computed in eval mode; frames past an
        utterance's end are 0. ``"final"``: the embedding as B x 1 x d."""
        ecapa = self.model.embedding_model
        blocks = getattr(ecapa, "blocks", [])
        if layer == "final":
            return self.embeddings(batch).unsqueeze(1)
        if layer == "mfa" and hasattr(ecapa, "mfa"):
            module = ecapa.mfa
        elif isinstance(layer, int) and not isinstance(layer, bool) and -len(blocks) <= layer < len(blocks):
            module = blocks[layer]
        else:
            raise ValueError(
                f"layer must be 'final', 'mfa' or an int in [-{len(blocks)}, {len(blocks) - 1}], got {layer!r}"
            )
        captured: list[torch.Tensor] = []
        handle = module.register_forward_hook(lambda _m, _i, out: captured.append(out))
        was_training = self.model.training
        try:
            self.model.eval()  # one pass per length (see by_length): the frames do not depend on the batch
            b = self._to(batch)
            groups = length_groups(b["wav_lens"], b["wavs"].shape[1])
            by_length(self.model, b["wavs"], b["wav_lens"])
        finally:
            handle.remove()
            self.model.train(was_training)
        if len(captured) == 1:
            return captured[0].transpose(1, 2)
        frames = max(c.shape[2] for c in captured)
        out = captured[0].new_zeros(b["wavs"].shape[0], frames, captured[0].shape[1])
        for (idx, _), states in zip(groups, captured):
            out[idx, : states.shape[2]] = states.transpose(1, 2)
        return out


def _load_kind(
    folder: str | os.PathLike,
    *,
    device: str | torch.device = "auto",
    trust_hparams: bool = False,
    scope: str = "all",
    **_: Any,
) -> SpeakerAdapter:
    adapter = SpeakerAdapter.load(folder, device=device, trust_hparams=trust_hparams)
    adapter.scope = scope
    return adapter


def _check_folder(folder: Path) -> None:
    """The folder's hyperparams.yaml names nothing but the allowed classes (it is carried into a restored copy)."""
    hparams = folder / HPARAMS
    check_hparams_tags(parse_hparams(hparams.read_text(encoding="utf-8"), hparams), hparams)


KIND = register_kind(
    Kind(
        "speaker",
        detect=lambda folder: (folder / HPARAMS).is_file(),
        load=_load_kind,
        adapter=SpeakerAdapter,
        sizes=("tiny", "small", "large"),
        default_size="small",
        description="speaker classifier in SpeechBrain's EncoderClassifier layout (hyperparams.yaml)",
        weight_files=(EMBEDDING_CKPT, CLASSIFIER_CKPT),
        read_weights=read_state,
        write_weights=write_state,
        check_folder=_check_folder,
        has_batchnorm=True,
        train_in_eval_mode=True,
        is_classifier=True,
        takes_audio=True,
        request_extract="gradient",
        priority=10,
        trainer="mmunlearn.adapters.speaker.training",
    )
)
