"""How batches of utterances reach a speaker classifier and what every classifier adapter scores from its logits:
labels, one pass per length for scoring, repeat padding for training, and the per-utterance scores
(:class:`ClassifierScores`) shared by the SpeechBrain (:mod:`~mmunlearn.adapters.speaker.adapter`) and Hugging Face
(:mod:`~mmunlearn.adapters.hf_audio.adapter`) adapters.

>>> wavs = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
>>> [(idx.tolist(), n) for idx, n in length_groups(torch.tensor([1.0, 0.5]), 4)]
[([1], 2), ([0], 4)]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from mmunlearn.adapters.base import IGNORE, AdapterDefaults

#: Version of how utterances are scored and trained on (cache keys of trained models and evaluations
#: include it). 2: scores do not depend on the batch (:func:`by_length`), training fills padding with
#: repeats of each utterance (:func:`repeat_pad`).
SCORING_VERSION = 2

#: The weights a classifier's erasure may extract from and edit (``scope``, the same for every classifier kind): all of
#: them, the ``head`` (the class rows) or the ``embedding`` model below it.
SCOPES = ("all", "head", "embedding")


def sample_counts(wav_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Samples of each utterance of a padded batch (``wav_lens`` relative to ``width``), at least 1."""
    return torch.round(wav_lens.detach().double() * width).long().clamp(1, width)


def length_groups(wav_lens: torch.Tensor, width: int) -> list[tuple[torch.Tensor, int]]:
    """(indices, samples) of the utterances of each length in a padded batch (``wav_lens`` relative to ``width``)."""
    samples = sample_counts(wav_lens, width).cpu()
    return [((samples == n).nonzero().squeeze(1), int(n)) for n in torch.unique(samples).tolist()]


def per_length(
    lengths: torch.Tensor, run: Callable[[torch.Tensor, int], tuple[torch.Tensor, ...]]
) -> tuple[torch.Tensor, ...]:
    """``run(indices, length)`` once per distinct length of ``lengths`` (ascending), its outputs (each with a first
    dimension of len(indices)) put back in batch order, out of place so that gradients reach every group.

    >>> per_length(torch.tensor([3, 1, 3]), lambda idx, n: (idx.float() * 10 + n,))
    (tensor([ 3., 11., 23.]),)
    """
    lengths = lengths.detach().cpu()
    outs: list[torch.Tensor] | None = None
    for n in torch.unique(lengths).tolist():
        idx = (lengths == n).nonzero().squeeze(1)
        parts = run(idx, int(n))
        if outs is None:
            outs = [p.new_zeros(len(lengths), *p.shape[1:]) for p in parts]
        outs = [o.index_copy(0, idx.to(o.device), p) for o, p in zip(outs, parts)]
    return tuple(outs or ())


def by_length(net: nn.Module, wavs: torch.Tensor, wav_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``net``'s (cosine, embedding) of a padded batch, each utterance seeing no padding: one pass per
    distinct length, on the utterances of that length cut to it.

    ECAPA masks padding only in its pooling and squeeze-excitation means; its convolutions (receptive
    field about +-11 frames), the filterbank's last frames and the sentence mean normalisation still
    read the padded frames, so a short utterance beside a long one scores differently than alone (on
    FSDD clips of ~0.4 s, a classifier trained with zero padding was right on 78 % of its training clips
    alone and 99.7 % in random batches). Cut to its own length, an utterance scores the same in any batch.
    """
    samples = sample_counts(wav_lens, wavs.shape[1])
    if bool((samples == wavs.shape[1]).all()):
        return net(wavs, torch.ones_like(wav_lens))

    def run(idx: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(wavs.device)
        return net(wavs[idx, :n], torch.ones(len(idx), device=wavs.device, dtype=wav_lens.dtype))

    cosine, emb = per_length(samples, run)
    return cosine, emb


def repeat_pad(wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
    """The batch with each utterance's padding filled by repeating the utterance (as fixed-length crops of
    short recordings are filled in SpeechBrain's VoxCeleb recipes), so training never sees zero padding.

    >>> repeat_pad(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 0.0, 0.0, 0.0]]), torch.tensor([1.0, 0.4]))
    tensor([[1., 2., 3., 4., 5.],
            [1., 2., 1., 2., 1.]])
    """
    width = wavs.shape[1]
    samples = sample_counts(wav_lens, width).to(wavs.device)
    if bool((samples == width).all()):
        return wavs
    pos = torch.arange(width, device=wavs.device).unsqueeze(0) % samples.unsqueeze(1)
    return wavs.gather(1, pos)


def labels_of(
    examples: Sequence[Mapping[str, Any]], index: Mapping[str, int], require_labels: bool = True
) -> torch.Tensor:
    """Class index of each example's ``spk_id`` in ``index`` (speaker ID -> class); an unknown or missing speaker is
    an error unless ``require_labels`` is False, then its label is -100 (``IGNORE``).

    >>> labels_of([{"spk_id": "b"}, {"ID": "u1"}], {"a": 0, "b": 1}, require_labels=False).tolist()
    [1, -100]
    """
    labels = []
    for i, ex in enumerate(examples):
        spk = ex.get("spk_id")
        label = index.get(str(spk), IGNORE) if spk is not None else IGNORE
        if label == IGNORE and require_labels:
            raise ValueError(
                f"example {i} ({ex.get('ID', '?')}): speaker {spk!r} is not one of the model's "
                f"{len(index)} classes (pass require_labels=False to score it)"
            )
        labels.append(label)
    return torch.tensor(labels, dtype=torch.long)


class ClassifierScores(AdapterDefaults):
    """The scores a speaker classifier adapter derives from its ``logits_and_embeddings(batch, model)`` (class logits
    B x C, the vectors the head reads B x d) and ``speakers``: each utterance is a one-"token" sequence whose target
    is its speaker, so the unlearning methods, the metrics and the audits read every classifier kind alike."""

    speakers: list[str]

    def logits_and_embeddings(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def logits(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Class logits (B x C): softmax of these is the model's class posterior."""
        return self.logits_and_embeddings(batch, model)[0]

    def embeddings(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """The vectors the classification head reads (B x d): what verification scores by cosine similarity."""
        return self.logits_and_embeddings(batch, model)[1]

    def logprobs(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(label | x) under softmax(logits) as B x 1 (0 where the label is unknown) and its B x 1 mask."""
        logits = self.logits(batch, model)
        labels = batch["labels"].to(logits.device)
        mask = (labels != IGNORE).unsqueeze(1)
        lp = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0).unsqueeze(1))
        return lp * mask, mask

    def sequence_logprob(
        self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None, average: bool = False
    ) -> torch.Tensor:
        """log p(label | x) per example (B,); ``average`` changes nothing (one target per utterance)."""
        return self.logprobs(batch, model)[0].squeeze(1)

    def target_distributions(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Log-probabilities over the speaker classes for every example (B x C), for KL terms."""
        return torch.log_softmax(self.logits(batch, model), -1)

    def nll(self, batch: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> torch.Tensor:
        """Per-example cross-entropy -log p(label | x) (B,); the membership-inference loss score."""
        return -self.sequence_logprob(batch, model)

    def predict(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Most likely class index per example (B,)."""
        with torch.no_grad():
            return self.logits(batch).argmax(-1)

    def speaker_of(self, indices: torch.Tensor | Sequence[int]) -> list[str]:
        """Speaker IDs of class indices."""
        return [self.speakers[int(i)] for i in indices]
