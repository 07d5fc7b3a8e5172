"""How padded batches of utterances reach ECAPA: one pass per length for scoring, repeat padding for training.

>>> wavs = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
>>> [(idx.tolist(), n) for idx, n in length_groups(torch.tensor([1.0, 0.5]), 4)]
[([1], 2), ([0], 4)]
"""

from __future__ import annotations

import torch
from torch import nn

#: Version of how utterances are scored and trained on (cache keys of trained models and evaluations
#: include it). 2: scores do not depend on the batch (:func:`by_length`), training fills padding with
#: repeats of each utterance (:func:`repeat_pad`).
SCORING_VERSION = 2


def sample_counts(wav_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Samples of each utterance of a padded batch (``wav_lens`` relative to ``width``), at least 1."""
    return torch.round(wav_lens.detach().double() * width).long().clamp(1, width)


def length_groups(wav_lens: torch.Tensor, width: int) -> list[tuple[torch.Tensor, int]]:
    """(indices, samples) of the utterances of each length in a padded batch (``wav_lens`` relative to ``width``)."""
    samples = sample_counts(wav_lens, width).cpu()
    return [((samples == n).nonzero().squeeze(1), int(n)) for n in torch.unique(samples).tolist()]


def by_length(net: nn.Module, wavs: torch.Tensor, wav_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``net``'s (cosine, embedding) of a padded batch, each utterance seeing no padding: one pass per
    distinct length, on the utterances of that length cut to it.

    ECAPA masks padding only in its pooling and squeeze-excitation means; its convolutions (receptive
    field about +-11 frames), the filterbank's last frames and the sentence mean normalisation still
    read the padded frames, so a short utterance beside a long one scores differently than alone (on
    FSDD clips of ~0.4 s, a classifier trained with zero padding was right on 78 % of its training clips
    alone and 99.7 % in random batches). Cut to its own length, an utterance scores the same in any batch.
    """
    groups = length_groups(wav_lens, wavs.shape[1])
    if len(groups) == 1 and groups[0][1] == wavs.shape[1]:
        return net(wavs, torch.ones_like(wav_lens))
    cosine: torch.Tensor | None = None
    emb: torch.Tensor | None = None
    for idx, n in groups:
        idx = idx.to(wavs.device)
        c, e = net(wavs[idx, :n], torch.ones(len(idx), device=wavs.device, dtype=wav_lens.dtype))
        if cosine is None:
            cosine = c.new_zeros(wavs.shape[0], *c.shape[1:])
            emb = e.new_zeros(wavs.shape[0], *e.shape[1:])
        cosine = cosine.index_copy(0, idx, c)  # out of place: gradients reach every group
        emb = emb.index_copy(0, idx, e)
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
