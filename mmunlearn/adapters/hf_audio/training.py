"""The hf-audio kind's trainer (:data:`mmunlearn.kinds.TRAINER_API`): a small wav2vec2-style
``AutoModelForAudioClassification`` speaker classifier built from a local config (never downloaded), its training
settings per size, and its training on manifest rows: what a benchmark (``voxceleb2 --model hf-audio``) builds its
original and retrained models with, the same steps as ECAPA's. The classifier: a convolutional waveform encoder,
``layers`` transformer layers, mean pooling over the frames and a linear head (``Wav2Vec2ForSequenceClassification``).
Its convolutions use layer norm and the feature extractor returns an attention mask, so a padded batch is one forward
pass and an utterance scores as it scores alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmunlearn.adapters.hf_audio.adapter import KIND, HFAudioAdapter
from mmunlearn.data.utterances import UtteranceDataset
from mmunlearn.train import TrainConfig, TrainResult
from mmunlearn.train import train as train_loop

#: Sizes of the classifier (``--preset``): width, transformer layers, heads, feed-forward width, convolution
#: channels, head projection. ``tiny`` is for tests.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        classifier_proj_size=16,
    ),
    "small": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        classifier_proj_size=32,
    ),
    "large": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        conv_dim=(64, 64, 64),
        classifier_proj_size=64,
    ),
}
#: Training of the original and retrained classifiers per size (AdamW, one-cycle schedule).
TRAIN: dict[str, TrainConfig] = {
    "tiny": TrainConfig(epochs=15, batch_size=8, lr=3e-3, schedule="onecycle", weight_decay=1e-4),
    "small": TrainConfig(epochs=8, batch_size=16, lr=2e-3, schedule="onecycle", weight_decay=1e-2),
    "large": TrainConfig(epochs=10, batch_size=16, lr=1e-3, schedule="onecycle", weight_decay=1e-2),
}
SAMPLE_RATE = 16000


def size_of(preset: str) -> str:
    """The size row of ``--preset`` (tiny, small; base and large both take ``large``: the kind's rule,
    :meth:`mmunlearn.kinds.Kind.size_for`)."""
    return KIND.size_for(preset)


def model_config(preset: str) -> Any:
    """The ``Wav2Vec2Config`` of a size: convolutions of strides 10, 4, 4 (160 samples per frame, 10 ms at 16 kHz),
    layer-normed, transformer layers normed before attention (``do_stable_layer_norm``; trained from scratch on FSDD
    for 4 epochs at 2e-3 without dropout: 86 % / 31 % on the kept / forgotten speakers' held-out clips, with dropout
    0.1 at 1e-3 70 % / 57 %, post-norm layers at 3e-3 19 % / 93 %, i.e. mostly one class); no dropout, no time
    masking (clips of 0.14 s have too few frames for its spans)."""
    from transformers import Wav2Vec2Config

    return Wav2Vec2Config(
        **SIZES[size_of(preset)],
        conv_kernel=(10, 8, 4),
        conv_stride=(10, 4, 4),
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
    )


def feature_extractor() -> Any:
    """Raw 16 kHz audio, each utterance normalised to zero mean and unit variance, with an attention mask."""
    from transformers import Wav2Vec2FeatureExtractor

    return Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0, do_normalize=True, return_attention_mask=True
    )


def train_config(preset: str, *, epochs: int | None = None, lr: float | None = None) -> TrainConfig:
    """Training settings of the original/retrained classifiers for ``preset`` with the command line's overrides."""
    changes = {k: v for k, v in (("epochs", epochs), ("lr", lr)) if v is not None}
    return TRAIN[size_of(preset)].replace(**changes)


def describe(preset: str) -> dict[str, Any]:
    """What the tables' context records about the model: its family, size and parameter count."""
    from transformers import AutoModelForAudioClassification

    config = model_config(preset)
    config.num_labels = 2
    params = sum(p.numel() for p in AutoModelForAudioClassification.from_config(config).parameters())
    return {
        "architecture": "Wav2Vec2ForSequenceClassification",
        "size": size_of(preset),
        "parameters_2_classes": params,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in SIZES[size_of(preset)].items()},
    }


def train(
    rows: Sequence[Mapping[str, Any]],
    *,
    speakers: Sequence[str],
    preset: str = "small",
    crop_seconds: float | None = 2.0,
    config: TrainConfig | None = None,
    seed: int = 0,
    device: str = "auto",
    progress: bool = True,
    desc: str = "train audio classifier",
) -> tuple[HFAudioAdapter, TrainResult]:
    """A fresh classifier of ``preset`` over ``speakers`` (in class order) trained on manifest ``rows`` with the
    shared training loop: cross-entropy on random crops of ``crop_seconds`` (shorter utterances whole; None: whole
    utterances), seeded by ``seed`` (initialisation, crops, batches)."""
    if not rows:
        raise ValueError("no training rows given")
    unknown = sorted({str(r["spk_id"]) for r in rows} - {str(s) for s in speakers})
    if unknown:
        raise ValueError(f"{len(unknown)} speaker(s) of the rows are not in the label space: {unknown[:5]}")
    cfg = (config or TRAIN[size_of(preset)]).replace(seed=seed)
    adapter = HFAudioAdapter.build(model_config(preset), list(speakers), feature_extractor(), seed=seed, device=device)
    rows = list(rows)
    if len(rows) % cfg.batch_size == 1:  # no batch of one (as the ECAPA trainer)
        rows.append(rows[int(np.random.default_rng([seed, 7]).integers(len(rows)))])
    data = UtteranceDataset(
        rows, crop_seconds=crop_seconds, seed=seed, cache=adapter.audio_cache, sr=adapter.sample_rate
    )
    result = train_loop(
        adapter.model,
        lambda m, b: adapter.loss(b, model=m),
        data,
        adapter.collate,
        cfg,
        device=device,
        progress=progress,
        desc=desc,
    )
    adapter.model.eval()
    return adapter, result


__all__ = ["SIZES", "TRAIN", "describe", "feature_extractor", "model_config", "size_of", "train", "train_config"]
