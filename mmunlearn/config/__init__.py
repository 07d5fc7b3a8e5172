"""Method configs: fields with help text, per-preset defaults (rows keyed by a registered model kind and size),
overrides by name.

Kept free of imports from the rest of the package (but the import-free kind registry, :mod:`mmunlearn.kinds`) so
that low layers (the optimisation losses, task-vector extraction) and the method plug-ins can all use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, fields, replace
from typing import Any, ClassVar

from mmunlearn.kinds import get_kind


def opt(default: Any = None, help: str = "", factory: Callable[[], Any] | None = None) -> Any:
    """A config field with help text (shown by ``mmunlearn methods``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


class PresetConfig:
    """Mixin of method configs: ``PRESETS[(kind, size)]`` holds the field overrides of a preset."""

    PRESETS: ClassVar[dict[tuple[str, str], dict[str, Any]]] = {}

    @classmethod
    def for_preset(cls, kind: str, size: str | None = None, **overrides: Any):
        """The config of ``kind``'s preset ``size`` (default the kind's ``default_size``), with ``overrides``; a kind
        the config has no row for takes the row of the kind it names in ``presets_from``."""
        spec = get_kind(kind)
        size = size or spec.default_size
        if size not in spec.sizes:
            raise ValueError(f"unknown {kind} preset size {size!r}; choose one of {spec.sizes}")
        row = cls.PRESETS.get((kind, size))
        if row is None and spec.presets_from is not None:
            row = cls.PRESETS.get((spec.presets_from, size))
        return with_overrides(cls(**(row or {})), **overrides)  # type: ignore[call-arg]


def with_overrides(cfg: Any, **overrides: Any) -> Any:
    """``cfg`` with the given fields replaced; None values are skipped, unknown names are an error.
    ``extract_<field>`` sets a field of a nested ``extract`` config."""
    names = {f.name for f in fields(cfg)}
    direct, nested = {}, {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in names:
            direct[key] = value
        elif key.startswith("extract_") and "extract" in names:
            nested[key[len("extract_") :]] = value
        else:
            raise ValueError(f"{type(cfg).__name__} has no setting {key!r}; settings: {sorted(names)}")
    if nested:
        direct["extract"] = replace(direct.get("extract", cfg.extract), **nested)
    return replace(cfg, **direct) if direct else cfg


def applicable_overrides(config_cls: type, overrides: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``overrides`` that ``config_cls`` has (a recipe passes one option set to every method)."""
    names = {f.name for f in fields(config_cls)}
    return {
        k: v
        for k, v in overrides.items()
        if v is not None and (k in names or (k.startswith("extract_") and "extract" in names))
    }
