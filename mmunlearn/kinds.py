"""The model-kind registry: each adapter module registers a :class:`Kind` (how to detect and load its folders,
its on-disk weight files, preset sizes and capabilities); the rest of the package asks the kind, never a name.

A kind is what a model folder holds (a Hugging Face causal LM, a speech LLM, a SpeechBrain speaker classifier, a
Hugging Face audio classifier, ...). Its adapter module calls :func:`register_kind` at import. The built-in adapter
modules (:data:`BUILTIN`) and any installed package's ``mmunlearn.kinds`` entry points are imported the first time
the registry is asked, so this module imports nothing of the package and every layer may use it.

Capabilities replace comparisons of kind names: ``has_batchnorm`` (fine-tuning moves running statistics: task
vectors are extracted on a copy, in batches of two or more), ``train_in_eval_mode`` (the optimisation methods
train with the model in eval mode), ``is_classifier`` (one label per utterance: the speaker sweep rule, the
classifier metrics and audits), ``takes_audio`` (a speech model: :func:`mmunlearn.unlearn` takes it).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Adapter modules that register the built-in kinds (imported on the registry's first use).
BUILTIN = (
    "mmunlearn.adapters.speaker.adapter",
    "mmunlearn.adapters.hf_audio.adapter",
    "mmunlearn.adapters.speech_llm.adapter",
    "mmunlearn.adapters.text.adapter",
)
#: Entry-point group through which another package adds a kind (its module calls :func:`register_kind`).
ENTRY_POINTS = "mmunlearn.kinds"
#: What a kind's trainer module defines: ``train(rows, *, speakers, preset, crop_seconds, config, seed, device,
#: progress, desc) -> (adapter, TrainResult)`` (a fresh model of the ``preset`` size over ``speakers``, trained on
#: manifest rows), ``train_config(preset, *, epochs=None, lr=None) -> TrainConfig`` (its training settings per
#: size) and ``describe(preset) -> dict`` (what a results table's context records about the model).
TRAINER_API = ("train", "train_config", "describe")
#: Largest JSON file a detector reads (a config.json is a few kB).
MAX_DETECT_JSON = 1 << 20


@dataclass(frozen=True)
class Kind:
    """One model kind: detection, loading, on-disk weights, preset sizes and capabilities.

    ``detect(folder) -> bool`` must be cheap and never raise: file names and small JSON only
    (:func:`read_small_json`). ``load(folder, *, device, **options)`` returns the kind's adapter; ``options`` are
    the entry points' loading settings (``where``, ``scope``, ``trust_hparams``): a loader reads those of its kind
    and refuses a value it cannot honour. ``weight_files``: the checkpoint files holding the weights as
    ``{name: tensor}`` state dicts (on-disk names ``<file stem>.<key>``), read by ``read_weights`` and written back
    by ``write_weights(state, path)`` in the kind's own format (restore); empty for safetensors shards
    (``model.safetensors`` or an index). ``check_folder``: validates a folder before ``mmunlearn restore`` copies its
    side files. ``presets_from``: the kind whose method preset rows (and so which methods apply) this kind takes where a
    method has no row of its own. ``trainer``: the module (dotted name, imported on use by :meth:`trainer_module`) that
    builds a fresh classifier of this kind and trains it on labelled rows, which is what a benchmark needs to make its
    original and retrained models (:data:`TRAINER_API`).
    """

    name: str
    detect: Callable[[Path], bool]
    load: Callable[..., Any]
    sizes: tuple[str, ...]
    default_size: str
    description: str
    weight_files: tuple[str, ...] = ()
    read_weights: Callable[[Path], dict[str, Any]] | None = None
    write_weights: Callable[[dict[str, Any], Path], None] | None = None
    check_folder: Callable[[Path], None] | None = None
    presets_from: str | None = None
    has_batchnorm: bool = False
    train_in_eval_mode: bool = False
    is_classifier: bool = False
    takes_audio: bool = False
    #: forget extraction a deletion request uses with a retain state and a sweep rule when the caller sets none
    #: (the cheapest that met the rule in ``mmunlearn bench requests``; None: the method preset's)
    request_extract: str | None = None
    priority: int = 50  # detection order: lower first (a catch-all such as "any config.json" goes last)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the adapter class ``load`` returns (tests check it implements mmunlearn.adapters.base's protocol: the
    #: classifier sub-protocol when ``is_classifier``, the token one otherwise)
    adapter: type | None = None
    trainer: str | None = None

    def trainer_module(self) -> Any:
        """The imported :attr:`trainer` module, checked to define :data:`TRAINER_API` (a ValueError when this kind
        has none or it lacks a name)."""
        if self.trainer is None:
            raise ValueError(f"model kind {self.name!r} names no trainer: a benchmark cannot build its models")
        module = importlib.import_module(self.trainer)
        missing = [n for n in TRAINER_API if not callable(getattr(module, n, None))]
        if missing:
            raise ValueError(f"model kind {self.name!r}: its trainer {self.trainer} lacks {missing}")
        return module

    def size_for(self, preset: str) -> str:
        """The preset row of a model preset or folder: the preset itself when it is one of :attr:`sizes` (listed
        smallest first), else the last (a model directory, or a preset larger than any row)."""
        return preset if preset in self.sizes else self.sizes[-1]

    def __post_init__(self) -> None:
        if self.default_size not in self.sizes:
            raise ValueError(f"kind {self.name!r}: default size {self.default_size!r} is not one of {self.sizes}")
        if self.weight_files and (self.read_weights is None or self.write_weights is None):
            raise ValueError(f"kind {self.name!r}: weight_files need read_weights and write_weights functions")


_REGISTRY: dict[str, Kind] = {}
_loaded = False


def register_kind(kind: Kind) -> Kind:
    """Add ``kind`` to the registry (its adapter module calls this at import); another module may not take a name
    already registered."""
    known = _REGISTRY.get(kind.name)
    if known is not None and getattr(known.load, "__module__", None) != getattr(kind.load, "__module__", None):
        raise ValueError(f"model kind {kind.name!r} is already registered")
    _REGISTRY[kind.name] = kind
    return kind


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN:
        importlib.import_module(module)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        ep.load()


def kinds() -> list[Kind]:
    """Every registered kind, in detection order."""
    _load_plugins()
    return sorted(_REGISTRY.values(), key=lambda k: k.priority)


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names, in detection order."""
    return tuple(k.name for k in kinds())


def get_kind(name: str) -> Kind:
    """The registered kind ``name`` (a ValueError listing the kinds when there is none)."""
    _load_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown model kind {name!r}; choose one of {kind_names()}")
    return _REGISTRY[name]


def kind_of(folder: str | os.PathLike) -> Kind | None:
    """The kind of a model folder by its files (the first whose ``detect`` accepts it), None when none does."""
    root = Path(folder)
    if not root.is_dir():
        return None
    return next((k for k in kinds() if k.detect(root)), None)


def read_small_json(path: Path, limit: int = MAX_DETECT_JSON) -> dict[str, Any] | None:
    """A JSON object file of at most ``limit`` bytes, or None (missing, larger, not JSON, not an object): what a
    detector reads, so that a malformed folder is simply not of its kind."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


__all__ = [
    "BUILTIN",
    "ENTRY_POINTS",
    "Kind",
    "get_kind",
    "kind_names",
    "kind_of",
    "kinds",
    "read_small_json",
    "register_kind",
]
