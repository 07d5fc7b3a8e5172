"""What one unlearning request is, as one frozen object: the method and its settings, the rule, where the output goes
and, for a deletion request, its retain state and batch.

:func:`mmunlearn.unlearn` builds an :class:`UnlearnRequest` from its keywords and hands it to
:func:`~mmunlearn.requests.run_request`, which hands the harness's part of it
(:meth:`UnlearnRequest.for_harness`) to :func:`~mmunlearn.methods.harness.run_unlearning`. What is not a setting --
the model, the forget and retain items, a reference model, a history -- travels beside it. A request is checked
when it is made: a bad value, or two settings that contradict each other, is a ``ValueError`` naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mmunlearn.config import opt
from mmunlearn.methods.base import get
from mmunlearn.methods.rule import SweepRule
from mmunlearn.taskvec.extract import ExtractConfig

#: The fields only :func:`~mmunlearn.requests.run_request` honours (the harness refuses a request that sets one).
REQUEST_ONLY: tuple[str, ...] = (
    "retain_state",
    "use_retain_state",
    "refresh_retain",
    "retain_extract",
    "batch",
    "compare_batch",
    "reuse_edit_size",
)
_PATHS = ("out", "undo_dir", "retain_state", "cache_dir")
_FLAGS = ("overwrite", "progress", "refresh_retain", "batch", "compare_batch", "reuse_edit_size")


@dataclass(frozen=True)
class UnlearnRequest:
    """One unlearning request's settings (frozen: derive a changed one with :func:`dataclasses.replace`)."""

    method: str = field(metadata={"help": "a registered method (mmunlearn.methods.names())"})
    kind: str = field(metadata={"help": "the model kind it runs on (mmunlearn.kinds): text, speech-llm, speaker, ..."})
    _: KW_ONLY
    config: Any = opt(None, "the method's whole config; None: its preset `size` for `kind` with `overrides`")
    size: str | None = opt(None, "the method's preset size (None: the kind's default); not with `config`")
    overrides: Mapping[str, Any] = opt(
        help="the method's settings by name over the preset; not with `config`", factory=dict
    )
    rule: SweepRule | None = opt(None, "the sweep rule on the training items (None: the config's settings as they are)")
    out: Path | None = opt(None, "the output folder (None: nothing is written)")
    inputs: tuple[str | os.PathLike, ...] = opt((), "folders and files `out` must not be, lie inside or contain")
    overwrite: bool = opt(False, "replace an earlier output in `out`")
    undo_dir: Path | None = opt(None, "where the undo records go (None: `<out>.undo`); needs `out`")
    cache_dir: str | None = opt(None, "T3's hidden-state cache folder")
    progress: bool = opt(True, "report progress on stderr")
    meta: Mapping[str, Any] = opt(help="extra JSON-able fields for the report (e.g. the source folder)", factory=dict)
    retain_state: Path | None = opt(
        None,
        "run_request: the retain state's folder (erasure methods): loaded when "
        "its fingerprints match, else computed and written there",
    )
    use_retain_state: bool | None = opt(
        None,
        "run_request: use a retain state (None: when `retain_state` names "
        "a folder; True without one: computed in memory)",
    )
    refresh_retain: bool = opt(False, "run_request: recompute the retain state even when it matches")
    retain_extract: ExtractConfig | None = opt(
        None,
        "run_request: how the retain state must be extracted "
        "(None: as a stored state was, else the preset's extraction)",
    )
    batch: bool = opt(False, "run_request: the forget items are several sets, edited once with their union")
    compare_batch: bool = opt(
        False, "run_request: with `batch`, also apply the sets one by one to a fresh copy and report the difference"
    )
    reuse_edit_size: bool = opt(
        True,
        "run_request: with a rule, an erasure sweep first tries the edit size the "
        "previous request of the same method chose",
    )

    def __post_init__(self) -> None:
        get(self.method, self.kind)  # an unknown method or kind, or a method that does not apply to the kind
        if not isinstance(self.overrides, Mapping) or not all(isinstance(k, str) for k in self.overrides):
            raise ValueError(f"overrides must map setting names to values, got {self.overrides!r:.200}")
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"meta must be a mapping of report fields, got {self.meta!r:.200}")
        object.__setattr__(self, "overrides", dict(self.overrides))  # the caller's dict may change later
        object.__setattr__(self, "meta", dict(self.meta))
        if self.config is not None and (self.size is not None or self.overrides):
            raise ValueError(
                "config is the method's whole config: give it, or a size and overrides, not both "
                f"(size={self.size!r}, overrides={sorted(self.overrides)})"
            )
        if self.config is None:  # an unknown size or setting name fails here, before any model is loaded
            get(self.method).config_for(self.kind, self.size, **self.overrides)
        if self.rule is not None and not isinstance(self.rule, SweepRule):
            raise ValueError(f"rule must be a SweepRule or None, got {type(self.rule).__name__}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r:.80}")
        if self.use_retain_state is not None and not isinstance(self.use_retain_state, bool):
            raise ValueError(f"use_retain_state must be True, False or None, got {self.use_retain_state!r:.80}")
        self._normalise_paths()
        if self.retain_extract is not None and not isinstance(self.retain_extract, ExtractConfig):
            raise ValueError(f"retain_extract must be an ExtractConfig, got {type(self.retain_extract).__name__}")
        self._check_combinations()

    def _normalise_paths(self) -> None:
        for name in _PATHS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"{name} must be a path or None, got {type(value).__name__}")
            if value is not None:
                object.__setattr__(self, name, str(value) if name == "cache_dir" else Path(value))
        if (
            isinstance(self.inputs, (str, os.PathLike))
            or not isinstance(self.inputs, Sequence)
            or not all(isinstance(p, (str, os.PathLike)) for p in self.inputs)
        ):
            raise ValueError(f"inputs must be a list of paths, got {self.inputs!r:.200}")
        object.__setattr__(self, "inputs", tuple(self.inputs))

    def _check_combinations(self) -> None:
        if self.undo_dir is not None and self.out is None:
            raise ValueError("undo_dir applies to a request with an output folder (out)")
        if self.compare_batch and not self.batch:
            raise ValueError(
                "compare_batch compares a batch with its sets one by one: it needs batch=True (several forget sets)"
            )
        if self.use_retain_state is False and self.retain_state is not None:
            raise ValueError(f"use_retain_state=False with a retain state folder ({self.retain_state}): give one")
        if self.refresh_retain and not self.wants_state:
            raise ValueError("refresh_retain recomputes a retain state: give retain_state (or use_retain_state=True)")

    @property
    def wants_state(self) -> bool:
        """Whether :func:`~mmunlearn.requests.run_request` uses a retain state (a folder named, or asked for)."""
        return self.use_retain_state if self.use_retain_state is not None else self.retain_state is not None

    def request_settings(self) -> list[str]:
        """The :data:`REQUEST_ONLY` fields this request sets to other than their defaults."""
        defaults = {f.name: f.default for f in fields(self)}
        return [name for name in REQUEST_ONLY if getattr(self, name) != defaults[name]]

    def for_harness(self, config: Any, **changes: Any) -> UnlearnRequest:
        """The harness's part of this request with the method's whole ``config`` (and ``changes``): the
        :data:`REQUEST_ONLY` fields back at their defaults, ``size`` and ``overrides`` folded into ``config``."""
        defaults = {f.name: f.default for f in fields(self) if f.name in REQUEST_ONLY}
        return replace(self, config=config, size=None, overrides={}, **{**defaults, **changes})


__all__ = ["REQUEST_ONLY", "UnlearnRequest"]
