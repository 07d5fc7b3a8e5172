"""The speaker classifier network (SpeechBrain Fbank + ECAPA-TDNN + cosine Classifier), presets, hyperparams.yaml.

:class:`SpeakerNet` holds the four modules of SpeechBrain's ``EncoderClassifier`` under the same
names (``compute_features``, ``mean_var_norm``, ``embedding_model``, ``classifier``), so its
parameter names are those of SpeechBrain checkpoints prefixed by the module name, e.g.
``embedding_model.blocks.0.conv.conv.weight``. :func:`hparams_yaml` writes the
``hyperparams.yaml`` of a SpeechBrain pretrained-model directory for a :class:`SpeakerConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

#: ECAPA-TDNN sizes. ``large`` is speechbrain/spkrec-ecapa-voxceleb's; ``base`` SpeechBrain's VoxCeleb
#: recipe default; ``small`` the CPU demo; ``tiny`` for tests.
PRESETS: dict[str, dict] = {
    "tiny": dict(n_mels=24, channels=[16, 16, 16, 16, 48], lin_neurons=16, attention_channels=8,
                 se_channels=8, res2net_scale=4),
    "small": dict(n_mels=40, channels=[64, 64, 64, 64, 192], lin_neurons=64, attention_channels=32,
                  se_channels=32, res2net_scale=4),
    "base": dict(n_mels=80, channels=[512, 512, 512, 512, 1536], lin_neurons=192, attention_channels=128,
                 se_channels=128, res2net_scale=8),
    "large": dict(n_mels=80, channels=[1024, 1024, 1024, 1024, 3072], lin_neurons=192, attention_channels=128,
                  se_channels=128, res2net_scale=8),
}

#: AAM-softmax defaults of SpeechBrain's ECAPA VoxCeleb recipe.
DEFAULT_MARGIN, DEFAULT_SCALE = 0.2, 30.0


@dataclass(frozen=True)
class SpeakerConfig:
    """Everything needed to build a :class:`SpeakerNet` (and to write its hyperparams.yaml)."""

    n_speakers: int
    n_mels: int = 40
    channels: list[int] = field(default_factory=lambda: [64, 64, 64, 64, 192])
    kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    lin_neurons: int = 64
    attention_channels: int = 32
    se_channels: int = 32
    res2net_scale: int = 4
    sample_rate: int = 16000
    margin: float = DEFAULT_MARGIN
    scale: float = DEFAULT_SCALE

    def __post_init__(self) -> None:
        if self.n_speakers < 1:
            raise ValueError(f"n_speakers must be >= 1, got {self.n_speakers}")
        if not len(self.channels) == len(self.kernel_sizes) == len(self.dilations) or len(self.channels) < 3:
            raise ValueError(f"channels, kernel_sizes and dilations need the same length >= 3, got "
                             f"{self.channels}, {self.kernel_sizes}, {self.dilations}")
        for c in self.channels[1:-1]:
            if c % self.res2net_scale:
                raise ValueError(f"SE-Res2Net channels {c} must be divisible by res2net_scale {self.res2net_scale}")
        for name in ("n_mels", "lin_neurons", "attention_channels", "se_channels", "res2net_scale", "sample_rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.margin < 1.0 or not self.scale > 0:
            raise ValueError(f"AAM margin must be in [0, 1) and scale > 0, got {self.margin}, {self.scale}")

    @classmethod
    def from_preset(cls, n_speakers: int, preset: str = "small", **overrides) -> "SpeakerConfig":
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return cls(n_speakers=n_speakers, **{**PRESETS[preset], **overrides})

    def to_dict(self) -> dict:
        return asdict(self)


class SpeakerNet(nn.Module):
    """Waveforms -> Fbank -> mean(-variance) normalisation -> ECAPA embedding -> cosine logits.

    ``forward(wavs, wav_lens)`` returns ``(cosine B x C, embeddings B x d)``; ``wav_lens`` are the
    relative lengths SpeechBrain uses (1.0 = the longest waveform of the batch).
    """

    def __init__(self, compute_features: nn.Module, mean_var_norm: nn.Module | None, embedding_model: nn.Module,
                 classifier: nn.Module):
        super().__init__()
        self.compute_features = compute_features
        self.mean_var_norm = mean_var_norm if mean_var_norm is not None else nn.Identity()
        self.embedding_model = embedding_model
        self.classifier = classifier

    @property
    def n_classes(self) -> int:
        return int(self.classifier.weight.shape[0])

    def features(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """Normalised filterbank features, B x frames x n_mels."""
        feats = self.compute_features(wavs)
        if isinstance(self.mean_var_norm, nn.Identity):
            return feats
        return self.mean_var_norm(feats, wav_lens)

    def embed(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> torch.Tensor:
        """Speaker embeddings, B x d."""
        return self.embedding_model(self.features(wavs, wav_lens), wav_lens).squeeze(1)

    def forward(self, wavs: torch.Tensor, wav_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.embed(wavs, wav_lens)
        return self.classifier(emb.unsqueeze(1)).squeeze(1), emb


def build_net(config: SpeakerConfig) -> SpeakerNet:
    """A freshly initialised :class:`SpeakerNet` (uses the global torch RNG)."""
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    c = config
    ecapa = ECAPA_TDNN(c.n_mels, lin_neurons=c.lin_neurons, channels=list(c.channels),
                       kernel_sizes=list(c.kernel_sizes), dilations=list(c.dilations),
                       attention_channels=c.attention_channels, res2net_scale=c.res2net_scale,
                       se_channels=c.se_channels)
    return SpeakerNet(Fbank(n_mels=c.n_mels, sample_rate=c.sample_rate),
                      InputNormalization(norm_type="sentence", std_norm=False), ecapa,
                      Classifier(input_size=c.lin_neurons, out_neurons=c.n_speakers))


def hparams_yaml(config: SpeakerConfig, pretrained_path: str = ".") -> str:
    """hyperparams.yaml in the layout of SpeechBrain's pretrained ``EncoderClassifier`` models.

    ``pretrained_path`` is where the pretrainer finds the checkpoint files; :meth:`SpeakerAdapter.load`
    overrides it with the directory it reads, SpeechBrain's ``from_hparams`` can do the same
    (``overrides={"pretrained_path": dir}``). ``aam_margin``/``aam_scale`` record the training loss.
    """
    c = config
    return f"""# Speaker classifier written by mmunlearn: SpeechBrain ECAPA-TDNN + cosine Classifier.
# Loads with mmunlearn's SpeakerAdapter.load(dir), or with SpeechBrain:
#   EncoderClassifier.from_hparams(source=dir, savedir=..., overrides={{"pretrained_path": dir}})
pretrained_path: {pretrained_path}
sample_rate: {c.sample_rate}
n_mels: {c.n_mels}
lin_neurons: {c.lin_neurons}
out_n_neurons: {c.n_speakers}
aam_margin: {c.margin}
aam_scale: {c.scale}

compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>
    sample_rate: !ref <sample_rate>

mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False

embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
    channels: {list(c.channels)}
    kernel_sizes: {list(c.kernel_sizes)}
    dilations: {list(c.dilations)}
    attention_channels: {c.attention_channels}
    se_channels: {c.se_channels}
    res2net_scale: {c.res2net_scale}
    lin_neurons: !ref <lin_neurons>

classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: !ref <lin_neurons>
    out_neurons: !ref <out_n_neurons>

modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    classifier: !ref <classifier>

label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder

pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""
