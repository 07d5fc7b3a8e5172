"""Recipe configs from a YAML file and ``key=value`` overrides, typed by the config dataclass's fields.

A recipe's settings are one dataclass (fields declared with :func:`mmunlearn.config.opt`, checked in its
``__post_init__``). :func:`build_config` layers, later over earlier: the dataclass defaults, a command's own
defaults, a YAML file (read with ``yaml.safe_load`` only: a file's tags never construct Python objects), the
options given on the command line, then ``key=value`` overrides. Every value is converted to its field's type
(:func:`coerce`); an unknown key is an error that lists the valid ones.

Method knobs: ``method_options`` maps a registered method's name to fields of its config dataclass
(``method_options: {rmu: {steering: 8, layer: 2}}`` in YAML, ``method_options.rmu.steering=8`` or
``method.rmu.steering=8`` as an override, ``--method-option rmu.steering=8`` on the command line); each value
is converted to that field's type and reaches only that method (:func:`parse_method_options`).

:class:`BenchmarkSettings` declares, once, the settings every benchmark's config shares (the methods and their knobs,
the sweep, the audit, resuming, the machine); a benchmark gives one another default with :func:`with_default`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from mmunlearn.config import opt
from mmunlearn.config.settings import MAX_CONFIG_BYTES, ConfigError, coerce, field_types, parse_assignments, read_yaml
from mmunlearn.methods import get, names

__all__ = [
    "MAX_CONFIG_BYTES",
    "METHOD_OPTIONS",
    "BenchmarkSettings",
    "ConfigError",
    "build_config",
    "coerce",
    "field_types",
    "parse_assignments",
    "parse_method_options",
    "read_yaml",
    "with_default",
]

#: The config field holding per-method settings, and the override prefixes that address it.
METHOD_OPTIONS = "method_options"
_PREFIXES = ("method_options.", "method.")


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """Settings every benchmark shares: output, methods, the sweep, the methods' knobs, resuming, the audit and the
    machine."""

    out: Path | None = opt(
        None,
        "Output folder: the tables and one folder per method (model/, run.json; tofu run: the "
        "method's model/, run.json and evaluation; voxceleb2 default: --workdir/<level>).",
    )
    methods: tuple[str, ...] = opt(
        ("all",), "Comma-separated methods (`mmunlearn methods` lists those of each model kind), or 'all'."
    )
    sweep: bool = opt(
        False,
        "Pick each method's settings by the rule on the training partitions: erasure rank/scale "
        "(and a classifier's scope), T3's temperature, the baselines' epochs (the speech LLM: the "
        "forget answers' NLL up to the retrained model's, the retain NLL up by <= retain_bound).",
    )
    rank: int | None = opt(
        None, "Erasure: forget rank k per matrix (with the sweep on a classifier: the only rank tried)."
    )
    scale: float | None = opt(None, "Erasure: W' = W - scale * T~ (a classifier's sweep chooses it instead).")
    extract: str | None = opt(
        None,
        "Erasure task vectors: finetune, lora, gradient or layerwise (default: the "
        "method's); a speaker classifier takes finetune or gradient, lora on a speech LLM "
        "needs where=text.",
    )
    extract_steps: int | None = opt(None, "Erasure: optimizer steps of the task-vector extraction (finetune, lora).")
    lr: float | None = opt(None, "Baselines and RMU: learning rate.")
    epochs: int | None = opt(None, "Baselines and RMU: epochs over the forget set (with the sweep: the most).")
    method_options: dict[str, dict[str, Any]] = opt(
        help="Per method, settings of its config: {rmu: {steering: 8, layer: 2}} (over the knobs above).", factory=dict
    )
    resume: bool = opt(
        True,
        "Reuse a method's finished stage (same method, options, rule and models: its run.json "
        "key) instead of redoing it; resume=false redoes it.",
    )
    audit: bool = opt(
        False,
        "Also run the robustness audits (paraphrase or held-out recordings, 8/4-bit quantisation, "
        "relearning, probe) on every method's model: <out>/AUDIT.json and AUDIT.md, "
        "<out>/<method>/AUDIT.json.",
    )
    audit_relearn_steps: int | None = opt(
        None, "--audit: relearning optimizer steps (default: the model kind's, mmunlearn.audit.options)."
    )
    audit_relearn_lr: float | None = opt(
        None, "--audit: relearning learning rate (default: the model kind's and preset's)."
    )
    audit_relearn_on: str | None = opt(
        None,
        "--audit: relearn on part of the forget set ('forget', default) or on retain data only ('retain', stricter).",
    )
    audit_attacks: str | None = opt(
        None, "--audit: attacks to run, comma-separated (paraphrase, quantise, relearn, probe; default all)."
    )
    seed: int = opt(0, "Seed of the data, model initialisation and unlearning.")
    device: str = opt("auto", "auto (CUDA when present), cpu or cuda.")
    threads: int | None = opt(
        None,
        "torch CPU threads (default without CUDA: 1, measured several times faster in wall "
        "time than 2 on this project's shared 2-core CPU; with CUDA: torch's choice).",
    )
    cache_dir: Path | None = opt(
        None, "Where built or trained models are cached (default: ~/.cache/mmunlearn; voxceleb2: --workdir)."
    )


def with_default(cls: type, name: str, default: Any) -> Any:
    """The field ``name`` of the config dataclass ``cls`` with another ``default``, its help kept (declared once, in
    ``cls``): a benchmark's own default for a shared setting."""
    return opt(default, cls.__dataclass_fields__[name].metadata["help"])


def _method_fields(name: str, kind: str | None) -> dict[str, Any]:
    """The settings of method ``name`` a recipe may set: its config's fields, and ``extract_<f>`` for the fields of
    a nested ``extract`` config (as :func:`mmunlearn.config.with_overrides` takes them). ``kind`` None: any
    registered method (a recipe whose model kind is a setting checks it applies)."""
    try:
        spec = get(name, kind)
    except ValueError:
        models = f" for {kind} models" if kind is not None else ""
        raise ConfigError(
            f"{METHOD_OPTIONS}: unknown method {name!r}{models}; choose from {', '.join(names(kind))}", METHOD_OPTIONS
        ) from None
    found = {}
    for key, tp in field_types(spec.config).items():
        if key == "extract" and dataclasses.is_dataclass(tp):
            found.update({f"extract_{k}": t for k, t in field_types(tp).items()})
        else:
            found[key] = tp
    return found


def parse_method_options(raw: Mapping[str, Any], kind: str | None = "text") -> dict[str, dict[str, Any]]:
    """``{method: {field: value}}`` checked against each registered method's config and typed by its fields (a
    nested ``extract`` mapping becomes ``extract_<field>``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{METHOD_OPTIONS}: expected a mapping of method names to settings, got {raw!r}", METHOD_OPTIONS
        )
    out: dict[str, dict[str, Any]] = {}
    for name, settings in raw.items():
        known = _method_fields(str(name), kind)
        if not isinstance(settings, Mapping):
            raise ConfigError(
                f"{METHOD_OPTIONS}.{name}: expected a mapping of settings, got {settings!r}", METHOD_OPTIONS
            )
        flat: dict[str, Any] = {}
        for key, value in settings.items():
            if key == "extract" and isinstance(value, Mapping):
                flat.update({f"extract_{k}": v for k, v in value.items()})
            else:
                flat[str(key)] = value
        typed = {}
        for key, value in flat.items():
            if key not in known:
                raise ConfigError(
                    f"{METHOD_OPTIONS}.{name}: no setting {key!r}; settings of {name}: {', '.join(sorted(known))}",
                    METHOD_OPTIONS,
                )
            typed[key] = coerce(value, known[key], f"{METHOD_OPTIONS}.{name}.{key}")
        out[str(name)] = {**out.get(str(name), {}), **typed}
    return out


def _nest(dotted: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"rmu.steering": v}`` as ``{"rmu": {"steering": v}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in dotted.items():
        name, sep, setting = key.rpartition(".")
        if not sep or not name or not setting:
            raise ConfigError(
                f"method option {key!r}: write METHOD.SETTING=VALUE (e.g. rmu.steering=8)", METHOD_OPTIONS
            )
        out.setdefault(name, {})[setting] = value
    return out


def build_config(
    cls: type,
    *,
    allowed: Collection[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    file: str | Path | None = None,
    given: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    method_settings: Iterable[str] = (),
    kind: str | None = "text",
) -> Any:
    """An instance of the config dataclass ``cls`` from its layers (module docstring), each value typed by its field.

    ``allowed``: the keys this command takes (default: every field); ``given``: options given on the command
    line (typed already, or text); ``overrides``: ``key=value`` texts; ``method_settings``: ``method.setting=value``
    texts (``--method-option``). A :class:`ConfigError` for an unknown key, a wrong type or a value the config's
    checks refuse.
    """
    types_ = field_types(cls)
    allowed = set(types_ if allowed is None else allowed)
    values: dict[str, Any] = dict(defaults or {})
    extra: dict[str, dict[str, Any]] = {}

    def put(key: str, value: Any, source: str) -> None:
        if key not in allowed or key not in types_:
            raise ConfigError(f"unknown setting {key!r} ({source}); valid settings: {', '.join(sorted(allowed))}", key)
        if key == METHOD_OPTIONS:
            for name, settings in parse_method_options(value, kind).items():
                extra[name] = {**extra.get(name, {}), **settings}
        else:
            values[key] = coerce(value, types_[key], key)

    if file is not None:
        for key, value in read_yaml(file).items():
            put(str(key), value, f"in {file}")
    for key, value in (given or {}).items():
        put(key, value, "option")
    dotted = {}
    for key, value in parse_assignments(overrides).items():
        prefix = next((p for p in _PREFIXES if key.startswith(p)), None)
        if prefix is not None and METHOD_OPTIONS in allowed:
            dotted[key[len(prefix) :]] = value
        else:
            put(key, value, "override")
    dotted.update(parse_assignments(method_settings, "--method-option"))
    if dotted:
        put(METHOD_OPTIONS, _nest(dotted), "override")
    if extra:
        values[METHOD_OPTIONS] = extra
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None
