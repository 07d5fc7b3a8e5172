"""What a method plug-in is: a typed config, a ``run`` function, the model kinds it applies to; one registry.

A method module defines a config dataclass (every field with ``metadata={"help": ...}``, per-preset
defaults in its ``PRESETS``) and ``run(adapter, forget, retain, config, ctx) -> MethodResult``, then
registers itself with :func:`register`. :mod:`mmunlearn.methods.harness` runs any of them on any adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from mmunlearn.config import KINDS, PresetConfig, with_overrides
from mmunlearn.kinds import get_kind
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

    def applies_to(self, kind: str) -> bool:
        """Whether the method applies to ``kind``: named in :attr:`kinds`, or the kind takes its presets from one
        that is (:attr:`~mmunlearn.kinds.Kind.presets_from`)."""
        return kind in self.kinds or get_kind(kind).presets_from in self.kinds

    def config_for(self, kind: str, size: str | None = None, **overrides: Any):
        """This method's config for a preset, with its fixed settings and the user's ``overrides``."""
        cfg = self.config.for_preset(kind, size)
        return with_overrides(cfg, **{**self.defaults, **overrides})


REGISTRY: dict[str, Method] = {}


def register(name: str, config: type, run: RunFn, *, kinds: Sequence[str] = KINDS, edits_weights: bool = True,
             help: str = "", defaults: dict | None = None) -> Method:
    """Add a method to the registry (a module calls this once at import)."""
    if not (is_dataclass(config) and issubclass(config, PresetConfig)):
        raise TypeError(f"{name}: config must be a dataclass deriving from PresetConfig")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"{name}: unknown model kinds {bad}")
    method = Method(name, config, run, tuple(kinds), edits_weights, help, dict(defaults or {}))
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


def names(kind: str | None = None) -> list[str]:
    """Registered method names in registry order (those applying to ``kind`` when given)."""
    return [n for n, m in REGISTRY.items() if kind is None or m.applies_to(kind)]
