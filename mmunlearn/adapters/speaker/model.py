"""The speaker classifier network (SpeechBrain Fbank + ECAPA-TDNN + cosine Classifier), presets, hyperparams.yaml.

:class:`SpeakerNet` holds the four modules of SpeechBrain's ``EncoderClassifier`` under the same
names (``compute_features``, ``mean_var_norm``, ``embedding_model``, ``classifier``), so its
parameter names are those of SpeechBrain checkpoints prefixed by the module name, e.g.
``embedding_model.blocks.0.conv.conv.weight``.

A :class:`SpeakerSpec` describes the four modules as data: an allow-listed class name
(:data:`MODULE_CLASSES`) and plain keyword arguments for each. :func:`build_modules` builds a
network from it through an explicit table of imported classes (never by importing a name read from
a file), and :func:`~mmunlearn.adapters.speaker.write_hparams.hparams_yaml` writes the ``hyperparams.yaml`` of a
SpeechBrain
pretrained-model directory from it, so a saved directory's YAML is always generated, never copied from an input.
Other modules an input's file names (spkrec's ``mean_var_norm_emb``) ride along as :class:`ExtraModule`: described
as data the same way, with their checkpoint's bytes, written back unchanged and never built here.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

#: ECAPA-TDNN sizes. ``large`` is speechbrain/spkrec-ecapa-voxceleb's; ``base`` SpeechBrain's VoxCeleb
#: recipe default; ``small`` the CPU demo; ``tiny`` for tests.
PRESETS: dict[str, dict] = {
    "tiny": dict(
        n_mels=24, channels=[16, 16, 16, 16, 48], lin_neurons=16, attention_channels=8, se_channels=8, res2net_scale=4
    ),
    "small": dict(
        n_mels=40,
        channels=[64, 64, 64, 64, 192],
        lin_neurons=64,
        attention_channels=32,
        se_channels=32,
        res2net_scale=4,
    ),
    "base": dict(
        n_mels=80,
        channels=[512, 512, 512, 512, 1536],
        lin_neurons=192,
        attention_channels=128,
        se_channels=128,
        res2net_scale=8,
    ),
    "large": dict(
        n_mels=80,
        channels=[1024, 1024, 1024, 1024, 3072],
        lin_neurons=192,
        attention_channels=128,
        se_channels=128,
        res2net_scale=8,
    ),
}

#: AAM-softmax defaults of SpeechBrain's ECAPA VoxCeleb recipe.
DEFAULT_MARGIN, DEFAULT_SCALE = 0.2, 30.0

FBANK = "speechbrain.lobes.features.Fbank"
INPUT_NORM = "speechbrain.processing.features.InputNormalization"
ECAPA = "speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN"
CLASSIFIER = "speechbrain.lobes.models.ECAPA_TDNN.Classifier"
PRETRAINER = "speechbrain.utils.parameter_transfer.Pretrainer"
LABEL_ENCODER = "speechbrain.dataio.encoder.CategoricalEncoder"

#: The classes each module of a :class:`SpeakerNet` may have (``mean_var_norm`` may also be absent).
MODULE_CLASSES: dict[str, tuple[str, ...]] = {
    "compute_features": (FBANK,),
    "mean_var_norm": (INPUT_NORM,),
    "embedding_model": (ECAPA,),
    "classifier": (CLASSIFIER,),
}
#: Names a keyword argument may hold as ``!name:`` (ECAPA-TDNN's ``activation``).
ACTIVATIONS: tuple[str, ...] = ("torch.nn.ReLU", "torch.nn.LeakyReLU", "torch.nn.PReLU", "torch.nn.GELU")
#: Keyword arguments dropped from a spec: where a module lives is the caller's choice, not the file's.
_PLACEMENT = ("device",)
#: Plausible audio sample rates (Hz): telephone speech is 8 kHz, studio audio at most 192 kHz.
SAMPLE_RATES = (1000, 192_000)
#: Ranges of the numeric arguments that size something a module allocates: ``key: (low, high, whole, unit)``
#: (a list-valued argument, e.g. ECAPA's ``channels``, has each element checked). Fbank's window and
#: filterbank are plain attributes allocated for real, which the meta-device size check never sees, so a
#: file asking for ``sample_rate: 1000000000000`` is refused here, before anything is built.
SIZE_LIMITS: dict[str, dict[str, tuple[float, float, bool, str]]] = {
    FBANK: {
        "sample_rate": (*SAMPLE_RATES, True, " Hz"),
        "n_fft": (16, 65_536, True, ""),
        "n_mels": (1, 1024, True, ""),
        "win_length": (0.1, 1000, False, " ms"),
        "hop_length": (0.1, 1000, False, " ms"),
        "left_frames": (0, 1000, True, ""),
        "right_frames": (0, 1000, True, ""),
        "f_min": (0, SAMPLE_RATES[1] / 2, False, " Hz"),
        "f_max": (0, SAMPLE_RATES[1] / 2, False, " Hz"),
        "param_change_factor": (0, 1000, False, ""),
        "param_rand_factor": (0, 1000, False, ""),
    },
    ECAPA: {
        "input_size": (1, 4096, True, ""),
        "lin_neurons": (1, 65_536, True, ""),
        "channels": (1, 65_536, True, ""),
        "kernel_sizes": (1, 1024, True, ""),
        "dilations": (1, 1024, True, ""),
        "attention_channels": (1, 65_536, True, ""),
        "res2net_scale": (1, 64, True, ""),
        "se_channels": (1, 65_536, True, ""),
        "groups": (1, 65_536, True, ""),
    },
    CLASSIFIER: {
        "input_size": (1, 65_536, True, ""),
        "lin_blocks": (0, 64, True, ""),
        "lin_neurons": (1, 65_536, True, ""),
        "out_neurons": (1, 10_000_000, True, ""),
    },
}
_MAX_LIST = 64  # ECAPA blocks: 5 in every published model


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
            raise ValueError(
                f"channels, kernel_sizes and dilations need the same length >= 3, got "
                f"{self.channels}, {self.kernel_sizes}, {self.dilations}"
            )
        for c in self.channels[1:-1]:
            if c % self.res2net_scale:
                raise ValueError(f"SE-Res2Net channels {c} must be divisible by res2net_scale {self.res2net_scale}")
        for name in ("n_mels", "lin_neurons", "attention_channels", "se_channels", "res2net_scale", "sample_rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.margin < 1.0 or not self.scale > 0:
            raise ValueError(f"AAM margin must be in [0, 1) and scale > 0, got {self.margin}, {self.scale}")

    @classmethod
    def from_preset(cls, n_speakers: int, preset: str = "small", **overrides) -> SpeakerConfig:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return cls(n_speakers=n_speakers, **{**PRESETS[preset], **overrides})

    def to_dict(self) -> dict:
        return asdict(self)

    def spec(self) -> SpeakerSpec:
        """The :class:`SpeakerSpec` of this configuration (what :func:`build_net` builds)."""
        return SpeakerSpec(
            compute_features=ModuleSpec.bind(FBANK, kwargs={"n_mels": self.n_mels, "sample_rate": self.sample_rate}),
            mean_var_norm=ModuleSpec.bind(INPUT_NORM, kwargs={"norm_type": "sentence", "std_norm": False}),
            embedding_model=ModuleSpec.bind(
                ECAPA,
                kwargs={
                    "input_size": self.n_mels,
                    "channels": list(self.channels),
                    "kernel_sizes": list(self.kernel_sizes),
                    "dilations": list(self.dilations),
                    "attention_channels": self.attention_channels,
                    "se_channels": self.se_channels,
                    "res2net_scale": self.res2net_scale,
                    "lin_neurons": self.lin_neurons,
                },
            ),
            classifier=ModuleSpec.bind(
                CLASSIFIER, kwargs={"input_size": self.lin_neurons, "out_neurons": self.n_speakers}
            ),
            sample_rate=self.sample_rate,
            margin=self.margin,
            scale=self.scale,
        )


class SpeakerNet(nn.Module):
    """Waveforms -> Fbank -> mean(-variance) normalisation -> ECAPA embedding -> cosine logits.

    ``forward(wavs, wav_lens)`` returns ``(cosine B x C, embeddings B x d)``; ``wav_lens`` are the
    relative lengths SpeechBrain uses (1.0 = the longest waveform of the batch).
    """

    def __init__(
        self,
        compute_features: nn.Module,
        mean_var_norm: nn.Module | None,
        embedding_model: nn.Module,
        classifier: nn.Module,
    ):
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


def _classes() -> dict[str, Any]:
    """Allow-listed dotted names -> the objects, by explicit import (never ``pydoc.locate`` of a file's text)."""
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    return {
        FBANK: Fbank,
        INPUT_NORM: InputNormalization,
        ECAPA: ECAPA_TDNN,
        CLASSIFIER: Classifier,
        "torch.nn.ReLU": nn.ReLU,
        "torch.nn.LeakyReLU": nn.LeakyReLU,
        "torch.nn.PReLU": nn.PReLU,
        "torch.nn.GELU": nn.GELU,
    }


@dataclass(frozen=True)
class NameRef:
    """A keyword argument that names a class instead of holding a value (``!name:torch.nn.ReLU``)."""

    target: str

    def __post_init__(self) -> None:
        if self.target not in ACTIVATIONS:
            raise ValueError(f"!name:{self.target} is not allowed as an argument; allowed: {list(ACTIVATIONS)}")


def _check_value(value: Any, where: str) -> Any:
    """``value`` as plain data (lists for tuples), or ValueError: only numbers, strings, booleans, None,
    lists, string-keyed mappings and :class:`NameRef` may appear in a spec."""
    if value is None or isinstance(value, (bool, int, str, NameRef)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: non-finite number {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        return [_check_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{where}: mapping keys must be strings")
        return {k: _check_value(v, f"{where}[{k}]") for k, v in value.items()}
    raise ValueError(f"{where}: {type(value).__name__} values are not allowed (plain data only)")


def _check_size(value: Any, limits: tuple[float, float, bool, str], where: str) -> None:
    low, high, whole, unit = limits
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (
        not number
        or (whole and isinstance(value, float) and not value.is_integer())
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"{where}: {value!r} is refused: expected {kind} in {low:g}..{high:g}{unit}")


def _check_sizes(target: str, kwargs: Mapping[str, Any], where: str) -> None:
    """ValueError naming the key for an argument of ``target`` outside :data:`SIZE_LIMITS` (before anything is
    built: no memory is asked for an absurd size), and for an Fbank window longer than its FFT."""
    for key, limits in SIZE_LIMITS.get(target, {}).items():
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            if len(value) > _MAX_LIST:
                raise ValueError(f"{where}[{key}]: {len(value)} entries are refused (at most {_MAX_LIST})")
            for i, v in enumerate(value):
                _check_size(v, limits, f"{where}[{key}][{i}]")
        else:
            _check_size(value, limits, f"{where}[{key}]")
    if target == FBANK:
        rate, n_fft = kwargs.get("sample_rate", 16000), kwargs.get("n_fft", 400)
        window = round(rate / 1000 * kwargs.get("win_length", 25))
        if window > n_fft:
            raise ValueError(
                f"{where}[win_length]: {kwargs.get('win_length', 25)!r} ms is {window} samples at "
                f"{rate} Hz, more than n_fft {n_fft}"
            )


@dataclass(frozen=True)
class ModuleSpec:
    """One module: an allow-listed class (dotted name) and its keyword arguments. Make one with
    :meth:`bind`, which checks the arguments against the class's signature and orders them by it."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def bind(
        cls, target: str, args: list | tuple = (), kwargs: Mapping[str, Any] | None = None, where: str = "module"
    ) -> ModuleSpec:
        """A spec for ``target(*args, **kwargs)``; ValueError for a class outside the allow-list, arguments
        the class does not take, or values that are not plain data."""
        classes = _classes()
        if target not in classes or target in ACTIVATIONS:
            raise ValueError(
                f"{where}: class {target} is not allowed; allowed: "
                f"{sorted(t for ts in MODULE_CLASSES.values() for t in ts)}"
            )
        kwargs = dict(kwargs or {})
        if not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"{where}: argument names must be strings")
        try:
            bound = inspect.signature(classes[target]).bind(*args, **kwargs)
        except TypeError as exc:
            raise ValueError(f"{where}: {target}: {exc}") from None
        clean = {k: _check_value(v, f"{where}[{k}]") for k, v in bound.arguments.items() if k not in _PLACEMENT}
        _check_sizes(target, clean, where)
        return cls(target, clean)

    def build(self) -> nn.Module:
        classes = _classes()
        if self.target not in classes or self.target in ACTIVATIONS:
            raise ValueError(f"class {self.target} is not allowed")
        kwargs = {k: _materialise(v, classes) for k, v in self.kwargs.items()}
        return classes[self.target](**kwargs)


def _materialise(value: Any, classes: Mapping[str, Any]) -> Any:
    if isinstance(value, NameRef):
        return classes[value.target]
    if isinstance(value, list):
        return [_materialise(v, classes) for v in value]
    if isinstance(value, dict):
        return {k: _materialise(v, classes) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class ExtraModule:
    """A module an input's hyperparams.yaml names besides the four (spkrec's ``mean_var_norm_emb``: SpeechBrain's
    ``encode_batch(normalize=True)`` uses it): its class and arguments, whether the file's pretrainer loads it and
    then its ``<name>.ckpt`` bytes; written back unchanged, never built by mmunlearn."""

    name: str
    module: ModuleSpec
    loadable: bool = False
    checkpoint: bytes | None = None


@dataclass(frozen=True)
class SpeakerSpec:
    """The four modules of a :class:`SpeakerNet` as data, plus the scalars hyperparams.yaml records and the
    other modules the file names (:class:`ExtraModule`, carried into a saved folder as they are)."""

    compute_features: ModuleSpec
    mean_var_norm: ModuleSpec | None
    embedding_model: ModuleSpec
    classifier: ModuleSpec
    sample_rate: int = 16000
    margin: float = DEFAULT_MARGIN
    scale: float = DEFAULT_SCALE
    extras: tuple[ExtraModule, ...] = ()

    def __post_init__(self) -> None:
        for role, allowed in MODULE_CLASSES.items():
            module = getattr(self, role)
            if module is None and role == "mean_var_norm":
                continue
            if not isinstance(module, ModuleSpec) or module.target not in allowed:
                raise ValueError(f"{role} must be one of {list(allowed)}, got {getattr(module, 'target', module)!r}")
        norm = self.mean_var_norm
        if norm is not None and norm.kwargs.get("norm_type", "global") == "global":
            raise ValueError(
                "mean_var_norm with norm_type 'global' keeps statistics this loader does not read; "
                "only 'sentence' / 'batch' normalisation is supported"
            )
        low, high = SAMPLE_RATES
        if (
            isinstance(self.sample_rate, bool)
            or not isinstance(self.sample_rate, int)
            or not low <= self.sample_rate <= high
        ):
            raise ValueError(f"sample_rate must be a whole number of Hz in {low}..{high}, got {self.sample_rate!r}")
        for name in ("margin", "scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"aam_{name} must be a finite number, got {value!r}")
        if not 0.0 <= self.margin < 1.0 or not self.scale > 0:
            raise ValueError(f"AAM margin must be in [0, 1) and scale > 0, got {self.margin}, {self.scale}")
        _check_extras(self.extras)


#: Keys of a written hyperparams.yaml that an extra module may not take (the four modules and the file's own keys).
RESERVED_KEYS = frozenset(
    {
        *MODULE_CLASSES,
        "sample_rate",
        "aam_margin",
        "aam_scale",
        "modules",
        "label_encoder",
        "pretrainer",
        "pretrained_path",
    }
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _check_extras(extras: tuple[ExtraModule, ...]) -> None:
    """ValueError unless each extra has its own plain name (a YAML key and ``<name>.ckpt``) and a ModuleSpec."""
    seen: set[str] = set()
    for extra in extras:
        if not isinstance(extra, ExtraModule) or not isinstance(extra.module, ModuleSpec):
            raise ValueError(f"extras must be ExtraModule(name, ModuleSpec, checkpoint), got {extra!r:.80}")
        name = extra.name
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED_KEYS or name in seen:
            raise ValueError(
                f"module name {name!r:.80} cannot be carried: a name of letters, digits and '_' is "
                f"needed, not one of {sorted(RESERVED_KEYS)} and not twice"
            )
        if extra.checkpoint is not None and not (extra.loadable and isinstance(extra.checkpoint, bytes)):
            raise ValueError(f"{name}: a checkpoint (bytes) is carried only for a module the pretrainer loads")
        seen.add(name)


def build_modules(spec: SpeakerSpec) -> SpeakerNet:
    """A freshly initialised :class:`SpeakerNet` of ``spec`` (uses the global torch RNG; the embedding
    model is built first, then the feature modules and the classifier)."""
    ecapa = spec.embedding_model.build()
    features = spec.compute_features.build()
    norm = spec.mean_var_norm.build() if spec.mean_var_norm is not None else None
    return SpeakerNet(features, norm, ecapa, spec.classifier.build())


def build_net(config: SpeakerConfig) -> SpeakerNet:
    """A freshly initialised :class:`SpeakerNet` (uses the global torch RNG)."""
    return build_modules(config.spec())
