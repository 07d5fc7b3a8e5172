"""What a method plug-in is: a typed config, a ``run`` function, the model kinds it applies to, what it needs
and makes, the extras it writes into an output folder; one registry.

A method module defines a config dataclass (every field with ``metadata={"help": ...}``, per-preset
defaults in its ``PRESETS``) and ``run(adapter, forget, retain, config, ctx) -> MethodResult``, then
registers itself with :func:`register`, declaring what it needs (:data:`NEEDS`) and makes (:data:`MAKES`) and,
when it writes files of its own, an :class:`Artefacts` that saves and reloads them.
:mod:`mmunlearn.methods.harness` runs any of them on any adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Protocol

from mmunlearn.config import PresetConfig, with_overrides
from mmunlearn.kinds import get_kind, kind_names
from mmunlearn.methods.rule import SweepRule


@dataclass
class RunContext:
    """What the harness hands a method besides its config."""

    kind: str  # a registered kind (mmunlearn.kinds)
    reference: Any = None  # adapter the erasure methods take task vectors from (None: the target)
    rule: SweepRule | None = None  # None: no sweep, the config's settings as they are
    cache_dir: str | None = None  # T3's hidden-state cache
    progress: bool = True
    #: precomputed retain task matrices (a retain state, :mod:`mmunlearn.requests.state`): the erasure
    #: methods then extract only the forget side
    retain_task: Any = None
    #: speakers that earlier deletion requests forgot (a classifier's request on an edited model), each with a
    #: stand-in for its direction or None (:func:`mmunlearn.methods.head_rows.forgotten_rows`)
    earlier_forgotten: Mapping[str, Any] | None = None


@dataclass
class MethodResult:
    """An adapter to evaluate and what it cost. ``erase_report``: the :class:`~mmunlearn.erase.EraseReport`
    of the applied edit (erasure methods); ``info``: JSON-able details (sweep points, chosen settings)."""

    adapter: Any
    extract_seconds: float  # task vectors or hidden-state cache (0 for the optimisation methods)
    unlearn_seconds: float  # the unlearning itself (erase / training / head fitting, sweep included)
    info: dict = field(default_factory=dict)
    erase_report: Any = None


RunFn = Callable[[Any, Sequence[Any], Sequence[Any], Any, RunContext], MethodResult]

#: What a method may need besides the model and the forget / retain items (callers prepare or cache these).
NEEDS: dict[str, str] = {
    "task_vectors": "per-layer forget and retain task matrices from a reference model's updates (a retain "
    "state, mmunlearn.requests.state, can supply the retain side)",
    "hidden_states": "the frozen model's hidden states on the forget and retain items (cached on disk)",
    "training": "optimiser steps on the forget (and retain) items",
}
#: What a method may make.
MAKES: dict[str, str] = {
    "weights": "edits the model's weights in place; the harness writes an undo patch that restores them",
    "head": "a separate head beside the unchanged weights (the output folder holds both)",
}


class Artefacts(Protocol):
    """A method's own files in an output folder, beside the model, the undo patch and ``unlearn_report.json``
    (which the harness writes for every method)."""

    #: the names it writes (declared in :mod:`mmunlearn.files.layout`)
    files: tuple[str, ...]

    def save(self, result: MethodResult, staging: Path, final: Path, report: dict) -> None:
        """Write the extras of ``result`` into ``staging`` (renamed to ``final`` once complete); add the paths
        (under ``final``) to ``report``."""

    def present(self, folder: Path) -> bool:
        """Whether ``folder`` holds this method's extras."""

    def load(self, folder: Path, adapter: Any) -> Any:
        """The unlearned adapter of an output ``folder`` from ``adapter`` (the weights of :meth:`model_folder`)."""

    def model_folder(self, folder: Path) -> Path:
        """The folder of an output ``folder`` that holds the model's own files (``folder`` itself unless the
        method moved them, as T3 moves the unchanged base into ``base/``)."""


@dataclass(frozen=True)
class Method:
    """A registered unlearning method."""

    name: str
    config: type  # a dataclass with PresetConfig
    run: RunFn
    kinds: tuple[str, ...]
    edits_weights: bool  # False: the base stays frozen (T3 wraps it)
    help: str
    defaults: dict = field(default_factory=dict)  # fixed settings of this name (e.g. svd-unlearn's subspace)
    needs: tuple[str, ...] = ()  # keys of NEEDS
    makes: tuple[str, ...] = ("weights",)  # keys of MAKES
    artefacts: Artefacts | None = None  # its own files in an output folder (None: the harness's only)

    def applies_to(self, kind: str) -> bool:
        """Whether the method applies to ``kind``: named in :attr:`kinds`, or the kind takes its presets from one
        that is (:attr:`~mmunlearn.kinds.Kind.presets_from`)."""
        return kind in self.kinds or get_kind(kind).presets_from in self.kinds

    def config_for(self, kind: str, size: str | None = None, **overrides: Any):
        """This method's config for a preset, with its fixed settings and the user's ``overrides``."""
        cfg = self.config.for_preset(kind, size)
        return with_overrides(cfg, **{**self.defaults, **overrides})


REGISTRY: dict[str, Method] = {}


def register(
    name: str,
    config: type,
    run: RunFn,
    *,
    kinds: Sequence[str] | None = None,
    edits_weights: bool = True,
    help: str = "",
    defaults: dict | None = None,
    needs: Sequence[str] = ("training",),
    artefacts: Artefacts | None = None,
) -> Method:
    """Add a method to the registry (a module calls this once at import). ``kinds``: the registered model kinds
    it applies to (default: those its config has preset rows for, ``config.PRESETS``; a kind without rows takes
    them through its ``presets_from``); ``needs``: keys of :data:`NEEDS`; it makes ``weights`` when
    ``edits_weights``, else a ``head``; ``artefacts``: its own output files."""
    if not (is_dataclass(config) and issubclass(config, PresetConfig)):
        raise TypeError(f"{name}: config must be a dataclass deriving from PresetConfig")
    if kinds is None:
        kinds = tuple(dict.fromkeys(kind for kind, _ in config.PRESETS))  # in the order the rows are written
    if not kinds:
        raise ValueError(f"{name}: applies to no model kind (give kinds=, or preset rows in {config.__name__})")
    bad = [k for k in kinds if k not in kind_names()]
    if bad:
        raise ValueError(f"{name}: unknown model kinds {bad}; registered: {', '.join(kind_names())}")
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"{name}: unknown needs {unknown}; choose from {sorted(NEEDS)}")
    if artefacts is not None and not all(isinstance(f, str) and f for f in getattr(artefacts, "files", ())):
        raise TypeError(f"{name}: artefacts must declare the file names it writes (.files)")
    makes = ("weights",) if edits_weights else ("head",)
    method = Method(
        name, config, run, tuple(kinds), edits_weights, help, dict(defaults or {}), tuple(needs), makes, artefacts
    )
    REGISTRY[name] = method
    return method


def get(name: str, kind: str | None = None) -> Method:
    """The registered method ``name`` (checked to apply to ``kind`` when given)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose one of {list(REGISTRY)}")
    method = REGISTRY[name]
    if kind is not None and not method.applies_to(kind):
        raise ValueError(f"{name} does not apply to a {kind} model (it applies to: {', '.join(method.kinds)})")
    return method


def needing(need: str, kind: str | None = None) -> list[str]:
    """Registered methods that declare ``need`` (a key of :data:`NEEDS`), those applying to ``kind`` when given."""
    if need not in NEEDS:
        raise ValueError(f"unknown need {need!r}; choose from {sorted(NEEDS)}")
    return [n for n in names(kind) if need in REGISTRY[n].needs]


def artefact_files() -> tuple[str, ...]:
    """Every file name a registered method writes into an output folder of its own (sorted, once each)."""
    return tuple(sorted({f for m in REGISTRY.values() if m.artefacts is not None for f in m.artefacts.files}))


def model_folder(folder: str | Path) -> Path:
    """Where an output ``folder``'s model files are: the folder the method whose extras it holds put them in (T3:
    ``base/``, :meth:`Artefacts.model_folder`), else ``folder`` itself. Load the weights from here, then
    :func:`load_unlearned`."""
    folder = Path(folder)
    for method in REGISTRY.values():
        if method.artefacts is not None and method.artefacts.present(folder):
            return method.artefacts.model_folder(folder)
    return folder


def load_unlearned(folder: str | Path, adapter: Any) -> Any:
    """The unlearned adapter of an output ``folder`` whose weights ``adapter`` holds (loaded from
    :func:`model_folder`): wrapped by the method whose extras the folder holds (T3's head), else ``adapter``
    itself (the weights are the unlearned model)."""
    folder = Path(folder)
    for method in REGISTRY.values():
        if method.artefacts is not None and not method.edits_weights and method.artefacts.present(folder):
            return method.artefacts.load(folder, adapter)
    return adapter


def names(kind: str | None = None) -> list[str]:
    """Registered method names in registry order (those applying to ``kind`` when given)."""
    return [n for n, m in REGISTRY.items() if kind is None or m.applies_to(kind)]
